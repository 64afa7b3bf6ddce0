"""The gRPC surface of a real daemon: idempotent Submit, Wait re-attach, health per alias,
reflection, GetModel, config file + flags, and calctl against it."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from tokenizers import Tokenizer

from calculet.client import DaemonClient
from calculet.daemon.core.events import FinalEvent, TokenChunk
from calculet.daemon.core.request import GenerationRequest, StoppingParams
from calculet.daemon.sampling.params import SamplingParams
from calculet.ops import calctl

pytestmark = pytest.mark.integration


def _req(client_id: str = "") -> GenerationRequest:
    return GenerationRequest("tiny", (5, 6, 7), SamplingParams(seed=3, temperature=0.9), StoppingParams(12), client_id)


def test_submit_with_the_same_client_request_id_returns_the_same_job(start_daemon) -> None:
    daemon = start_daemon("--model", "tiny=tiny")
    with DaemonClient(daemon.target) as c:
        first = c.submit(_req("abc"))
        again = c.submit(_req("abc"))
        other = c.submit(_req("xyz"))
        assert again.job_id == first.job_id and again.deduplicated and not first.deduplicated
        assert other.job_id != first.job_id
        assert c.status().job_counters.accepted == 2


def test_wait_reattaches_from_an_event_index(start_daemon) -> None:
    daemon = start_daemon("--model", "tiny=tiny")
    with DaemonClient(daemon.target) as c:
        job = c.submit(_req()).job_id
        events = list(c.wait(job))
        assert isinstance(events[-1], FinalEvent) and len(events) == 13
        tail = list(c.wait(job, from_index=5))
        assert tail == events[5:], "re-attaching replays exactly the events from that index"
        tokens = [t for e in events if isinstance(e, TokenChunk) for t in e.tokens]
        assert [e.first_index for e in events if isinstance(e, TokenChunk)] == list(range(12))
        assert len(tokens) == 12


def test_grpc_health_per_alias_reflection_and_get_model(start_daemon) -> None:
    daemon = start_daemon("--model", "tiny=tiny")
    with grpc.insecure_channel(daemon.target) as ch:
        health = health_pb2_grpc.HealthStub(ch)
        serving = health_pb2.HealthCheckResponse.SERVING
        assert health.Check(health_pb2.HealthCheckRequest(service="")).status == serving
        assert health.Check(health_pb2.HealthCheckRequest(service="tiny")).status == serving
        with pytest.raises(grpc.RpcError) as info:
            health.Check(health_pb2.HealthCheckRequest(service="nope"))
        assert info.value.code() is grpc.StatusCode.NOT_FOUND
        refl = reflection_pb2_grpc.ServerReflectionStub(ch)
        responses = list(refl.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")])))
        names = {s.name for s in responses[0].list_services_response.service}
        assert "calculet.v1.Daemon" in names and "grpc.health.v1.Health" in names
    with DaemonClient(daemon.target) as c:
        model = c.get_model("tiny")
        tok = Tokenizer.from_str(model.tokenizer_json.decode())
        assert tok.get_vocab_size() == model.model.vocab_size == 512
        assert "<|im_start|>" in model.chat_template
        assert model.model.context == 256 and list(model.model.eos_token_ids)
        c.drain(timeout_ms=1000)
    with grpc.insecure_channel(daemon.target) as ch:
        health = health_pb2_grpc.HealthStub(ch)
        assert (
            health.Check(health_pb2.HealthCheckRequest(service="")).status == health_pb2.HealthCheckResponse.NOT_SERVING
        )


def test_config_file_with_flag_override_and_calctl(start_daemon, tmp_path: Path, capsys) -> None:
    config = tmp_path / "daemon.toml"
    config.write_text('[daemon]\npolicy = "serial"\n[daemon.models]\ntiny = "tiny"\n')
    daemon = start_daemon("--config", str(config), "--policy", "continuous")
    with DaemonClient(daemon.target) as c:
        status = c.status()
    assert status.policy == 1, "the --policy flag overrides the file"  # POLICY_CONTINUOUS
    assert [m.alias for m in status.models] == ["tiny"], "startup models come from the file"
    target = ["--daemon", daemon.target]
    assert calctl.main(["health", *target]) == 0
    capsys.readouterr()
    assert calctl.main(["status", "--json", *target]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["models"][0]["alias"] == "tiny"
    assert calctl.main(["load", "tiny2", "tiny", *target]) == 0
    assert calctl.main(["load", "tiny2", "tiny", *target]) == 1, "already loaded without --replace"
    assert calctl.main(["unload", "tiny2", *target]) == 0
    assert calctl.main(["load", "evil", "../outside", *target]) == 1
    assert calctl.main(["drain", "--timeout", "5", *target]) == 0
    assert calctl.main(["health", *target]) == 1
    assert calctl.main(["resume", *target]) == 0
    assert calctl.main(["health", *target]) == 0
