"""The gRPC surface of a real daemon: idempotent Submit, Wait re-attach, health per alias,
reflection, GetModel (Qwen3's 5.36 MB tokenizer through a stock channel), the client's
chunks/logprobs, WatchLoad and health Watch, config file + flags, and calctl against it."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from tokenizers import Tokenizer

from calculet.client import (
    AsyncDaemonClient,
    DaemonClient,
    FinalEvent,
    FinishReason,
    ModelState,
    SamplingParams,
    ServingStatus,
    SubmitResult,
    TokenChunk,
)
from calculet.ops import calctl
from calculet.v1 import daemon_pb2_grpc, observe_pb2

pytestmark = pytest.mark.integration


def _submit(c: DaemonClient, client_id: str = "") -> SubmitResult:
    sampling = SamplingParams(seed=3, temperature=0.9)
    return c.submit("tiny", (5, 6, 7), sampling=sampling, max_tokens=12, client_request_id=client_id)


def test_submit_with_the_same_client_request_id_returns_the_same_job(start_daemon) -> None:
    daemon = start_daemon("--model", "tiny=tiny")
    with DaemonClient(daemon.target) as c:
        first = _submit(c, "abc")
        again = _submit(c, "abc")
        other = _submit(c, "xyz")
        assert again.job_id == first.job_id and again.deduplicated and not first.deduplicated
        assert other.job_id != first.job_id
        assert c.status().job_counters.accepted == 2


def test_wait_reattaches_from_an_event_index(start_daemon) -> None:
    daemon = start_daemon("--model", "tiny=tiny")
    with DaemonClient(daemon.target) as c:
        job = _submit(c).job_id
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
        assert tok.get_vocab_size() == model.vocab_size == 512
        assert "<|im_start|>" in model.chat_template
        assert model.context == 256 and model.eos_token_ids and model.state is ModelState.READY
        assert model.alias == "tiny" and model.generation >= 1 and model.package_name == "calsim-tiny"
        c.drain(timeout_ms=1000)
    with grpc.insecure_channel(daemon.target) as ch:
        health = health_pb2_grpc.HealthStub(ch)
        assert (
            health.Check(health_pb2.HealthCheckRequest(service="")).status == health_pb2.HealthCheckResponse.NOT_SERVING
        )


def test_get_model_streams_qwens_tokenizer_to_a_stock_channel(start_daemon, models_root: Path) -> None:
    """Issue 21: Qwen3's tokenizer.json is over gRPC's default 4 MiB receive limit; a channel opened
    without options (as grpcurl or any stock client) still gets it whole, in messages under it."""
    stock_limit = 4 * 1024 * 1024
    manifest = json.loads((models_root / "qwen" / "calculet-package.json").read_text())
    on_disk = (models_root / "qwen" / manifest["tokenizer"]["path"]).read_bytes()
    assert len(on_disk) > stock_limit
    daemon = start_daemon("--model", "qwen=qwen")
    with grpc.insecure_channel(daemon.target) as ch:
        stub = daemon_pb2_grpc.DaemonStub(ch)
        messages = list(stub.GetModel(observe_pb2.GetModelRequest(alias="qwen"), timeout=30))
    assert len(messages) > 1 and all(m.ByteSize() < stock_limit for m in messages)
    assert messages[0].model.alias == "qwen" and messages[0].tokenizer_size == len(on_disk)
    assert b"".join(m.tokenizer_json for m in messages) == on_disk
    with DaemonClient(daemon.target) as c:  # the client library keeps gRPC's default limit too
        model = c.get_model("qwen")
    assert model.tokenizer_json == on_disk and "<|im_start|>" in model.chat_template
    assert Tokenizer.from_str(model.tokenizer_json.decode()).get_vocab_size() > 150_000


def test_chunks_logprobs_load_reports_and_health_watch(start_daemon) -> None:
    daemon = start_daemon("--model", "tiny=tiny")
    with DaemonClient(daemon.target) as c:
        gen = c.generate("tiny", [5, 6, 7], max_tokens=8, temperature=0.0, logprobs=2, ignore_eos=True)
        chunks = list(gen.chunks())
        assert [t for ch in chunks for t in ch.tokens] == gen.tokens and len(gen.tokens) == 8
        for ch in chunks:
            assert [lp.token for lp in ch.logprobs] == list(ch.tokens)
            assert all(lp.logprob <= 0 and len(lp.top) == 2 for lp in ch.logprobs)
            # greedy: the sampled token is the most likely one
            assert all(lp.top[0][0] == lp.token for lp in ch.logprobs)
        assert gen.final is not None and gen.final.reason is FinishReason.LENGTH
        assert gen.final.usage.completion_tokens == 8 and gen.final.error is None
        with contextlib.closing(c.watch_load(50)) as reports:
            first = next(reports)
        assert first.status is ServingStatus.SERVING and first.sequence == 0
        assert [(m.alias, m.state, m.ready) for m in first.models] == [("tiny", ModelState.READY, True)]

    async def watch() -> list[ServingStatus]:
        async with AsyncDaemonClient(daemon.target) as ac:
            statuses = ac.watch_health()
            async with contextlib.aclosing(statuses):  # type: ignore[type-var]
                seen = [await anext(statuses)]
                await ac.drain(timeout_ms=0)  # the daemon publishes a draining board as NOT_SERVING
                seen.append(await asyncio.wait_for(anext(statuses), 10))
                await ac.resume()
                seen.append(await asyncio.wait_for(anext(statuses), 10))
            return seen

    assert asyncio.run(watch()) == [ServingStatus.SERVING, ServingStatus.NOT_SERVING, ServingStatus.SERVING]


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
    assert [m["alias"] for m in shown["boards"][0]["models"]] == ["tiny"]
    assert calctl.main(["load", "tiny2", "tiny", *target]) == 0
    assert calctl.main(["load", "tiny2", "tiny", *target]) == 1, "already loaded without --replace"
    assert calctl.main(["unload", "tiny2", *target]) == 0
    assert calctl.main(["load", "evil", "../outside", *target]) == 1
    assert calctl.main(["drain", "--timeout", "5", *target]) == 0
    assert calctl.main(["health", *target]) == 1
    assert calctl.main(["resume", *target]) == 0
    assert calctl.main(["health", *target]) == 0


def test_calctl_resets_shows_the_audit_trail(start_daemon, capsys) -> None:
    daemon = start_daemon("--model", "tiny=tiny")
    target = ["--daemon", daemon.target]
    with DaemonClient(daemon.target) as c:
        c.reset("ccu", "first check")
        c.reset("configuration", "second check")
    capsys.readouterr()
    assert calctl.main(["resets", "--json", *target]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert [(r["kind"], r["reason"], r["ok"]) for r in shown["history"]] == [
        ("RESET_KIND_CCU", "first check", True),
        ("RESET_KIND_CONFIGURATION", "second check", True),
    ]
    assert shown["history"][1]["generations_before"] == ["tiny@1 (tiny)"]
    assert calctl.main(["resets", *target]) == 0
    table = capsys.readouterr().out
    assert "second check" in table and "operator" in table and "budget" in table
