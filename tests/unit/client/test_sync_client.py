"""`DaemonClient` against the in-process fake daemon on a Unix socket: every RPC, its refusals as
typed errors, metadata, streaming (tokens and chunks), re-attach, health Watch, and the message
size limit."""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2

from calculet.client import (
    DaemonClient,
    FinalEvent,
    FinishReason,
    LoadReport,
    ModelInfo,
    ModelLoad,
    ModelState,
    SamplingParams,
    ServingStatus,
    StreamState,
    TokenChunk,
)
from calculet.common.error_codes import RETRY_AFTER_KEY
from calculet.common.errors import (
    Aborted,
    CalculetError,
    ErrorKind,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    Overloaded,
    Unauthenticated,
    Unavailable,
)
from calculet.v1 import common_pb2, inference_pb2

from .conftest import start_server
from .fake_daemon import (
    DAEMON_SEED,
    DEFAULT_MAX_TOKENS,
    Failure,
    FakeDaemon,
    completion_tokens,
    final_event,
    tokens_of,
)


@pytest.fixture
def client(daemon: str) -> DaemonClient:
    with DaemonClient(daemon, timeout=10.0, token="tok-1") as c:
        yield c  # type: ignore[misc]


# ---- inference plane -------------------------------------------------------------------


def test_generate_streams_the_jobs_tokens_and_final(client: DaemonClient, fake: FakeDaemon) -> None:
    gen = client.generate("tiny", [3, 4, 5], max_tokens=5)
    assert gen.job_id == "job-1" and gen.generation == 3
    assert list(gen) == completion_tokens([3, 4, 5], 0, 5) == gen.tokens
    assert gen.final is not None and gen.final.reason is FinishReason.LENGTH
    assert gen.final.usage.completion_tokens == 5 and gen.state is StreamState.DONE
    ((submit, _),) = fake.calls_of("Submit")
    assert submit.stopping.max_tokens == 5


def test_unset_seed_and_max_tokens_are_left_to_the_daemon(client: DaemonClient, fake: FakeDaemon) -> None:
    gen = client.generate("tiny", [1])
    assert gen.seed == DAEMON_SEED
    assert len(gen.result()) == DEFAULT_MAX_TOKENS
    ((submit, _),) = fake.calls_of("Submit")
    assert not submit.sampling.HasField("seed") and not submit.stopping.HasField("max_tokens")


def test_a_given_seed_is_sent_and_returned(client: DaemonClient) -> None:
    assert client.generate("tiny", [1], seed=99, max_tokens=1).seed == 99
    assert client.generate("tiny", [1], sampling=SamplingParams(seed=5), max_tokens=1).seed == 5


def test_tokens_arrive_before_the_job_ends(client: DaemonClient, fake: FakeDaemon) -> None:
    gate = threading.Event()
    fake.next_gates = {1: gate}  # the fake holds everything after the first chunk
    gen = client.generate("tiny", [2], max_tokens=4)
    first = next(gen)
    assert first == completion_tokens([2], 0, 1)[0]
    assert gen.final is None and not gen.done
    gate.set()
    assert [first, *gen] == completion_tokens([2], 0, 4)


def test_a_broken_wait_stream_is_reattached_from_the_next_index(client: DaemonClient, fake: FakeDaemon) -> None:
    fake.next_breaks = {1, 3}  # UNAVAILABLE before events 1 and 3 (once each)
    tokens = client.generate("tiny", [8, 9], max_tokens=6).result()
    assert tokens == completion_tokens([8, 9], 0, 6)
    assert [req.from_event_index for req, _ in fake.calls_of("Wait")] == [0, 1, 3]


def test_resumed_generation_continues_after_the_resume_tokens(client: DaemonClient, fake: FakeDaemon) -> None:
    done = completion_tokens([8, 9], 0, 2)
    gen = client.generate("tiny", [8, 9], max_tokens=6, resume_tokens=done, seed=3)
    assert done + gen.result() == completion_tokens([8, 9], 0, 6)


def test_a_job_lost_with_its_stream_is_unavailable(client: DaemonClient, fake: FakeDaemon) -> None:
    fake.next_breaks, fake.next_lost_on_break = {1}, True
    gen = client.generate("tiny", [8], max_tokens=6)
    with pytest.raises(Unavailable, match="resubmit with resume_tokens"):
        gen.result()
    assert gen.tokens == completion_tokens([8], 0, 2)


def test_the_reattach_budget_is_bounded(daemon: str, fake: FakeDaemon) -> None:
    fake.fail["Wait"] = Failure(grpc.StatusCode.UNAVAILABLE, "Socket closed")
    with DaemonClient(daemon, max_reattach=2) as client:
        gen = client.generate("tiny", [1], max_tokens=2)
        with pytest.raises(Unavailable, match="Socket closed"):
            gen.result()
    assert len(fake.calls_of("Wait")) == 3


def test_a_failed_final_raises_its_typed_error(client: DaemonClient, fake: FakeDaemon) -> None:
    error = common_pb2.ErrorStatus(kind=common_pb2.ERROR_KIND_ABORTED, message="recovery budget exhausted")
    fake.script = lambda req, generation: [final_event(0, inference_pb2.FINISH_REASON_ERROR, error=error)]
    gen = client.generate("tiny", [1])
    with pytest.raises(Aborted, match="recovery budget exhausted") as info:
        list(gen)
    assert gen.final is not None and gen.final.reason is FinishReason.ERROR
    assert gen.final.error is info.value and gen.final.error.kind is ErrorKind.ABORTED


def test_chunks_stream_the_tokens_that_arrived_together(client: DaemonClient, fake: FakeDaemon) -> None:
    fake.next_breaks = {1, 2}  # re-attached twice on the way
    gen = client.generate("tiny", [3, 4], max_tokens=5)
    chunks = list(gen.chunks())
    want = completion_tokens([3, 4], 0, 5)
    assert [c.tokens for c in chunks] == [tuple(want[0:2]), tuple(want[2:4]), tuple(want[4:5])]
    assert [(c.index, c.first_index) for c in chunks] == [(0, 0), (1, 2), (2, 4)]
    assert gen.tokens == want and gen.state is StreamState.DONE
    assert gen.final is not None and gen.final.index == 3 and gen.final.reason is FinishReason.LENGTH
    assert [req.from_event_index for req, _ in fake.calls_of("Wait")] == [0, 1, 2]


def test_chunks_raise_the_jobs_error(client: DaemonClient, fake: FakeDaemon) -> None:
    fake.next_breaks, fake.next_lost_on_break = {1}, True
    gen = client.generate("tiny", [8], max_tokens=6)
    got: list[TokenChunk] = []
    with pytest.raises(Unavailable, match="resubmit with resume_tokens"):
        for chunk in gen.chunks():
            got.append(chunk)
    assert [t for c in got for t in c.tokens] == completion_tokens([8], 0, 2) == gen.tokens


def test_max_reattach_zero_fails_over_at_once(daemon: str, fake: FakeDaemon) -> None:
    fake.next_breaks = {1}
    with DaemonClient(daemon, max_reattach=0) as client:
        gen = client.generate("tiny", [8], max_tokens=6)
        with pytest.raises(Unavailable, match="Socket closed"):
            gen.result()
        assert gen.tokens == completion_tokens([8], 0, 2) and gen.state is StreamState.LOST
    assert len(fake.calls_of("Wait")) == 1
    assert fake.calls_of("Health") == []


def test_submit_wait_cancel(client: DaemonClient, fake: FakeDaemon) -> None:
    submitted = client.submit("tiny", (5, 6), sampling=SamplingParams(seed=1), max_tokens=3, client_request_id="r1")
    assert (submitted.job_id, submitted.seed, submitted.generation, submitted.deduplicated) == ("job-1", 1, 3, False)
    ((req, _),) = fake.calls_of("Submit")
    assert req.client_request_id == "r1" and req.sampling.seed == 1 and req.stopping.max_tokens == 3
    events = list(client.wait(submitted.job_id))
    assert [e.index for e in events] == list(range(len(events)))
    assert tokens_of(events) == completion_tokens([5, 6], 0, 3)
    assert isinstance(events[-1], FinalEvent) and all(isinstance(e, TokenChunk) for e in events[:-1])
    tail = list(client.wait(submitted.job_id, from_index=len(events) - 1))
    assert tail == events[-1:]
    assert client.cancel(submitted.job_id) is True
    assert client.cancel(submitted.job_id) is False  # already finished / cancelled
    with pytest.raises(NotFound, match="job 'nope'"):
        client.cancel("nope")


def test_submit_takes_the_same_arguments_as_generate(client: DaemonClient, fake: FakeDaemon) -> None:
    job = client.submit(
        "tiny", [1, 2], max_tokens=4, temperature=0.5, top_p=0.9, top_k=7, stop_token_ids=[9], ignore_eos=True,
        logprobs=2, priority=-5, resume_tokens=[3], deadline_s=2.0, session_id="s1",
    )  # fmt: skip
    assert job.seed == DAEMON_SEED
    ((req, _),) = fake.calls_of("Submit")
    s = req.sampling
    assert not s.HasField("seed") and s.temperature == 0.5 and s.top_p == pytest.approx(0.9) and s.top_k == 7
    assert s.logprobs == 2 and req.priority == -5 and req.deadline_ms == 2000 and req.session_id == "s1"
    assert list(req.stopping.stop_token_ids) == [9] and req.stopping.ignore_eos and list(req.resume_tokens) == [3]
    events = list(client.wait(job.job_id))
    assert tokens_of(events) == completion_tokens([1, 2], 1, 3)
    with pytest.raises(InvalidArgument, match="sampling"):
        client.submit("tiny", [1], seed=1, sampling=SamplingParams())


def test_wait_refusals_are_typed(client: DaemonClient) -> None:
    with pytest.raises(NotFound):
        list(client.wait("nope"))
    job = client.submit("tiny", (1,), max_tokens=2)
    with pytest.raises(InvalidArgument, match="from_event_index"):
        list(client.wait(job.job_id, from_index=99))


@pytest.mark.parametrize(
    ("model", "prompt", "cls", "match"),
    [
        ("ghost", [1], NotFound, "model 'ghost' is not loaded"),
        ("tiny", [], InvalidArgument, "prompt_tokens: must not be empty"),
        ("tiny", [1, 5000], InvalidArgument, "prompt_tokens\\[1\\]: token id 5000"),
    ],
)
def test_submit_refusals_are_typed(client: DaemonClient, model: str, prompt: list[int], cls: type, match: str) -> None:
    with pytest.raises(cls, match=match):
        client.generate(model, prompt)


def test_overloaded_carries_the_trailing_retry_hint(client: DaemonClient, fake: FakeDaemon) -> None:
    fake.fail["Submit"] = Failure(grpc.StatusCode.RESOURCE_EXHAUSTED, "queue full", ((RETRY_AFTER_KEY, "2.5"),))
    with pytest.raises(Overloaded, match="queue full") as info:
        client.generate("tiny", [1])
    assert info.value.retry_after_s == 2.5


def test_draining_board_is_unavailable(client: DaemonClient, fake: FakeDaemon) -> None:
    fake.draining = True
    with pytest.raises(Unavailable, match="not READY"):
        client.generate("tiny", [1])


def test_the_token_is_sent_on_unary_and_streaming_calls(client: DaemonClient, fake: FakeDaemon) -> None:
    client.generate("tiny", [1], max_tokens=1).result()
    client.health()
    for method in ("Submit", "Wait", "Health"):
        ((_, metadata),) = fake.calls_of(method)
        assert metadata["authorization"] == "Bearer tok-1"


def test_no_token_no_authorization_header(daemon: str, fake: FakeDaemon) -> None:
    with DaemonClient(daemon) as client:
        client.health()
    ((_, metadata),) = fake.calls_of("Health")
    assert "authorization" not in metadata


def test_unauthenticated_is_typed(client: DaemonClient, fake: FakeDaemon) -> None:
    fake.fail["Status"] = Failure(grpc.StatusCode.UNAUTHENTICATED, "unknown credential")
    with pytest.raises(Unauthenticated):
        client.status()


# ---- observation plane -----------------------------------------------------------------


def test_health_status_and_model(client: DaemonClient, fake: FakeDaemon) -> None:
    health = client.health()
    assert health.status == common_pb2.SERVING_STATUS_SERVING and [m.alias for m in health.models] == ["tiny"]
    status = client.status()
    assert [m.alias for m in status.models] == ["tiny"] and len(status.device.chips) == 2
    model = client.get_model("tiny")
    assert model == ModelInfo(
        alias="tiny", generation=3, state=ModelState.READY, package_name="tiny", package_hash="ab" * 32,
        family="qwen3_moe", quantization="bf16", vocab_size=1000, context=256, lanes=4, eos_token_ids=(2,),
        bos_token_id=1, pad_token_id=None, model_max_length=256, tokenizer_json=fake.tokenizer_json,
        chat_template="{{ messages }}",
    )  # fmt: skip
    with pytest.raises(NotFound, match="ghost"):
        client.get_model("ghost")


def test_a_tokenizer_larger_than_grpcs_default_limit_arrives_whole(client: DaemonClient, fake: FakeDaemon) -> None:
    fake.tokenizer_json = bytes(range(256)) * (6 * 1024 * 1024 // 256)  # 6 MiB > 4 MiB default
    assert client.get_model("tiny").tokenizer_json == fake.tokenizer_json


def test_watch_load_streams_reports_until_closed(client: DaemonClient, fake: FakeDaemon) -> None:
    reports = client.watch_load(100)
    first = [next(reports) for _ in range(3)]
    assert [r.sequence for r in first] == [0, 1, 2]
    tiny = ModelLoad(
        "tiny", 3, ModelState.READY, True, queue_depth=1, running=1, free_lanes=3, lanes_total=4, prefix_reuse=False
    )  # the fake's reports carry no prefix blocks
    assert first[1] == LoadReport(board="fake-0", status=ServingStatus.SERVING, sequence=1, models=(tiny,))
    reports.close()  # type: ignore[attr-defined]
    fake.draining = True
    with contextlib.closing(client.watch_load()) as drained:
        assert next(drained).status is ServingStatus.DRAINING
    with pytest.raises(InvalidArgument, match="interval_ms"):
        next(client.watch_load(10))


def test_watch_health_follows_the_standard_health_service(client: DaemonClient, fake: FakeDaemon) -> None:
    board = client.watch_health()
    assert next(board) is ServingStatus.SERVING
    fake.health.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
    assert next(board) is ServingStatus.NOT_SERVING
    fake.health.set("", health_pb2.HealthCheckResponse.SERVING)
    assert next(board) is ServingStatus.SERVING
    board.close()  # type: ignore[attr-defined]
    with contextlib.closing(client.watch_health("tiny")) as model:
        assert next(model) is ServingStatus.NOT_SERVING  # SERVICE_UNKNOWN until the alias is published
        fake.health.set("tiny", health_pb2.HealthCheckResponse.SERVING)
        assert next(model) is ServingStatus.SERVING


def test_watch_health_of_a_dead_daemon_is_unavailable(tmp_path: Path, fake: FakeDaemon) -> None:
    with DaemonClient(str(tmp_path / "nobody.sock"), timeout=5.0) as client, pytest.raises(Unavailable):
        next(client.watch_health())
    sock = tmp_path / "w.sock"
    server = start_server(fake, sock)
    with DaemonClient(f"unix://{sock}", timeout=5.0) as client:
        statuses = client.watch_health()
        assert next(statuses) is ServingStatus.SERVING
        server.stop(grace=None).wait(5)
        with pytest.raises(Unavailable):
            next(statuses)


# ---- operations plane ------------------------------------------------------------------


def test_load_streams_progress_to_ready(client: DaemonClient, fake: FakeDaemon) -> None:
    progress = list(client.load("tiny2", "packages/tiny"))
    states = [p.state for p in progress]
    assert states == [
        common_pb2.MODEL_STATE_VALIDATING,
        common_pb2.MODEL_STATE_CONFIGURING,
        common_pb2.MODEL_STATE_WARMING,
        common_pb2.MODEL_STATE_READY,
    ]
    assert progress[-1].done and not any(p.done for p in progress[:-1])
    final = client.load_and_wait("tiny", "packages/tiny", replace=True, drain_timeout_ms=0, lanes=2)
    assert final.state == common_pb2.MODEL_STATE_READY and final.generation > progress[-1].generation
    (req, _) = fake.calls_of("Load")[-1]
    assert req.options.replace and req.options.drain_timeout_ms == 0 and req.options.lanes == 2


def test_a_failed_load_raises_its_typed_error(client: DaemonClient) -> None:
    progress = list(client.load("bad", "packages/broken"))
    assert progress[-1].state == common_pb2.MODEL_STATE_FAILED and progress[-1].done
    with pytest.raises(FailedPrecondition, match="hash mismatch"):
        client.load_and_wait("bad", "packages/broken")


@pytest.mark.parametrize(
    ("alias", "package", "cls", "match"),
    [
        ("tiny", "packages/tiny", FailedPrecondition, "use replace"),
        ("-bad", "packages/tiny", InvalidArgument, "not a valid alias"),
        ("ok", "../escape", InvalidArgument, "must stay in the root"),
        ("ok", "packages/none", NotFound, "no such directory"),
    ],
)
def test_load_refusals_are_typed(client: DaemonClient, alias: str, package: str, cls: type, match: str) -> None:
    with pytest.raises(cls, match=match):
        client.load_and_wait(alias, package)


def test_unload_drain_resume(client: DaemonClient, fake: FakeDaemon) -> None:
    resp = client.unload("tiny", drain_timeout_ms=0)
    assert (resp.generation, resp.interrupted_jobs) == (3, 1)
    with pytest.raises(NotFound):
        client.unload("tiny")
    fake.remaining_jobs = 2
    drained = client.drain(timeout_ms=100)
    assert not drained.drained and drained.remaining_jobs == 2
    assert client.drain(interrupt_remaining=True).interrupted_jobs == 2
    assert client.resume().was_draining is True
    assert client.resume().was_draining is False
    (req, _) = fake.calls_of("Drain")[0]
    assert req.timeout_ms == 100


def test_reset_and_inject_fault(client: DaemonClient, fake: FakeDaemon) -> None:
    result = client.reset("configuration", "operator test", model="tiny")
    assert result.ok and [(g.alias, g.before) for g in result.generations] == [("tiny", 3)]
    assert result.generations[0].after > 3
    with pytest.raises(InvalidArgument, match="reason"):
        client.reset("ccu", "")
    with pytest.raises(InvalidArgument, match="model: only with kind CONFIGURATION"):
        client.reset("device", "x", model="tiny")
    with pytest.raises(InvalidArgument, match="kind: 'reboot'"):
        client.reset("reboot", "x")
    assert client.inject_fault("ccu_exception", job_index=20).planned_faults == 1
    assert client.inject_fault(clear_existing=True).planned_faults == 0
    fake.fault_injection = False
    with pytest.raises(FailedPrecondition, match="disabled"):
        client.inject_fault("hang", probability=0.1, seed=4)


# ---- client lifecycle and transport ----------------------------------------------------


def test_a_closed_client_refuses_calls(daemon: str) -> None:
    client = DaemonClient(daemon)
    client.close()
    client.close()  # idempotent
    with pytest.raises(FailedPrecondition, match="closed"):
        client.health()
    with pytest.raises(FailedPrecondition, match="closed"):
        client.watch_load()


def test_an_unreachable_daemon_is_unavailable(tmp_path: Path) -> None:
    with DaemonClient(str(tmp_path / "nobody.sock"), timeout=5.0) as client, pytest.raises(Unavailable):
        client.health()


def test_an_unknown_status_code_is_internal(client: DaemonClient, fake: FakeDaemon) -> None:
    fake.fail["Health"] = Failure(grpc.StatusCode.UNKNOWN, "Exception calling application: boom")
    with pytest.raises(CalculetError, match="boom") as info:
        client.health()
    assert info.value.kind is ErrorKind.INTERNAL


def test_bad_constructor_arguments(daemon: str) -> None:
    with pytest.raises(InvalidArgument, match="target"):
        DaemonClient("nowhere")
    with pytest.raises(InvalidArgument, match="timeout"):
        DaemonClient(daemon, timeout=0)
    with pytest.raises(InvalidArgument, match="token"):
        DaemonClient(daemon, token="a b")


def test_reattach_waits_for_a_restarted_daemon(tmp_path: Path, fake: FakeDaemon) -> None:
    sock = tmp_path / "r.sock"
    server = start_server(fake, sock)
    gate = threading.Event()
    fake.next_gates = {1: gate}
    try:
        with DaemonClient(f"unix://{sock}", timeout=10.0) as client:
            gen = client.generate("tiny", [4], max_tokens=4)
            head = [next(gen), next(gen)]  # the first chunk; the fake holds event 1
            server.stop(grace=None).wait(5)  # the stream breaks with the connection
            rest: list[int] = []
            reader = threading.Thread(target=lambda: rest.extend(gen))  # blocks until the daemon is back
            reader.start()
            server = start_server(fake, sock)  # same fake: the "daemon" still knows the job
            gate.set()
            reader.join(10)
            assert not reader.is_alive()
            assert head + rest == completion_tokens([4], 0, 4)
    finally:
        fake.open_all_gates()
        server.stop(grace=None).wait(5)
    assert [req.from_event_index for req, _ in fake.calls_of("Wait")] == [0, 1]
