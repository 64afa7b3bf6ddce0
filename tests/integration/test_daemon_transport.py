"""Hardening of the daemon's transport against hostile clients and a SIGTERM (issue 7, items 2 and 10).

- Maximal prompts (the largest message the old 4 MiB limit let through, the largest the daemon's
  limit lets through now, and a context-length prompt whose last id is out of the vocabulary), sent
  five times a second by each of three clients, must not stall a concurrent stream nor Health: the
  stream keeps at least 80 % of the tokens/s it had alone, measured in the same run, and Health's
  median latency stays within a generous factor of its median before the attack.
- Bytes that do not parse as the request type get INVALID_ARGUMENT from every RPC (not UNKNOWN).
- SIGTERM with a hung device job: after the drain window the job's Wait stream gets an in-band
  Final ERROR / UNAVAILABLE (the gateway resumes it elsewhere) and the process exits well before
  the job timeout.

Raw channels and stubs throughout, so the exact status codes show and the client library's own
checks cannot intervene.
"""

from __future__ import annotations

import signal
import statistics
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import grpc
import pytest
from grpc_health.v1 import health_pb2

from calculet.daemon.server import app
from calculet.v1 import daemon_pb2, daemon_pb2_grpc, inference_pb2, observe_pb2, operate_pb2

from .conftest import shared_daemon
from .helpers import assert_idle_soon

pytestmark = pytest.mark.integration

CALL_S = 20.0  # deadline of every call a defect could leave hanging
OLD_LIMIT_BYTES = 4 * 1024 * 1024  # the receive limit before issue 7: what the attack sent
WINDOW_S = 2.0  # each rate is tokens counted over this long
ATTACKERS = 3
ATTACKS_PER_S = 5.0
KEEP_RATE = 0.8  # the stream keeps at least this share of its tokens/s under attack
HEALTH_SLOWDOWN = 10.0  # Health's median latency under attack, at most this many times its median before
JOB_TIMEOUT_S = 120.0  # the hung job's --job-timeout: shutdown must not wait for it
SERVICE = daemon_pb2.DESCRIPTOR.services_by_name["Daemon"]


def _path(method: str) -> str:
    return f"/{SERVICE.full_name}/{method}"


def _prompt_request(model: str, tokens: list[int], max_tokens: int | None = None) -> bytes:
    stopping = inference_pb2.StoppingParams(max_tokens=max_tokens) if max_tokens else None
    return inference_pb2.SubmitRequest(model=model, prompt_tokens=tokens, stopping=stopping).SerializeToString()


def _largest_prompt(model: str, limit_bytes: int) -> bytes:
    """The SubmitRequest with the most 1-byte token ids that still fits `limit_bytes`."""
    overhead = len(_prompt_request(model, [1])) + 8  # tag, alias and a length prefix of up to 5 bytes
    body = _prompt_request(model, [1] * (limit_bytes - overhead))
    assert len(body) <= limit_bytes
    return body


def _maximal_prompts(model: str, vocab_size: int, context: int) -> list[bytes]:
    """One attack per client: the issue's 4 MiB prompt, the largest the daemon's default limit takes,
    and a prompt of the full context whose last id is outside the vocabulary (every id must be read)."""
    full = [vocab_size - 1] * (context - 2) + [vocab_size]
    return [
        _largest_prompt(model, OLD_LIMIT_BYTES),
        _largest_prompt(model, app.DEFAULT_MAX_MESSAGE_BYTES),
        _prompt_request(model, full, max_tokens=1),
    ]


@dataclass
class TokenClock:
    """Arrival times of a job's tokens, from a Wait stream read on a thread of its own."""

    stub: daemon_pb2_grpc.DaemonStub
    job_id: str
    arrivals: list[float] = field(default_factory=list)
    final: inference_pb2.Final | None = None
    error: grpc.RpcError | None = None

    def __post_init__(self) -> None:
        self.thread = threading.Thread(target=self._read, name="token-clock", daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            for event in self.stub.Wait(inference_pb2.WaitRequest(job_id=self.job_id), timeout=600):
                if event.HasField("final"):
                    self.final = event.final
                    return
                now = time.monotonic()
                self.arrivals.extend([now] * len(event.tokens.tokens))
        except grpc.RpcError as exc:
            self.error = exc

    def count(self, start: float, end: float) -> int:
        return sum(1 for t in list(self.arrivals) if start <= t < end)


def _poll(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _health_latencies(stub: daemon_pb2_grpc.DaemonStub, until: float) -> list[float]:
    """Call Health every 50 ms until `until`; each call's latency."""
    latencies = []
    while (now := time.monotonic()) < until:
        stub.Health(observe_pb2.HealthRequest(), timeout=CALL_S)
        latencies.append(time.monotonic() - now)
        time.sleep(max(0.0, min(0.05, until - time.monotonic())))
    return latencies


class Attacker:
    """A client sending one pre-serialized Submit `per_s` times a second on its own channel."""

    def __init__(self, target: str, body: bytes, per_s: float) -> None:
        self.channel = grpc.insecure_channel(target, options=[("grpc.max_send_message_length", -1)])
        self.call = self.channel.unary_unary(_path("Submit"))  # bytes in, bytes out
        self.body = body
        self.period = 1.0 / per_s
        self.codes: list[grpc.StatusCode] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="attacker", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        next_at = time.monotonic()
        while not self.stop.is_set():
            try:
                self.call(self.body, timeout=CALL_S)
                self.codes.append(grpc.StatusCode.OK)
            except grpc.RpcError as exc:
                self.codes.append(exc.code())
            next_at += self.period
            self.stop.wait(max(0.0, next_at - time.monotonic()))  # pacing, not a race

    def close(self) -> None:
        self.stop.set()
        self.thread.join(CALL_S * 2)
        self.channel.close()


def test_maximal_prompts_do_not_stall_a_stream_or_health(start_daemon) -> None:
    daemon = start_daemon("--model", "qwen=qwen", "--time-scale", "1")
    with grpc.insecure_channel(daemon.target) as channel:  # stock limits: GetModel streams the tokenizer
        stub = daemon_pb2_grpc.DaemonStub(channel)
        model = next(stub.GetModel(observe_pb2.GetModelRequest(alias="qwen"), timeout=CALL_S)).model
        attacks = _maximal_prompts("qwen", model.vocab_size, model.context)
        job = stub.Submit(
            inference_pb2.SubmitRequest(
                model="qwen",
                prompt_tokens=[1, 2, 3],
                sampling=inference_pb2.SamplingParams(temperature=0.0),
                stopping=inference_pb2.StoppingParams(max_tokens=model.context - 8, ignore_eos=True),
            ),
            timeout=CALL_S,
        )
        clock = TokenClock(stub, job.job_id)
        _poll(lambda: bool(clock.arrivals), CALL_S, "the stream's first token")

        alone_start = time.monotonic()
        health_alone = _health_latencies(stub, alone_start + WINDOW_S)
        alone = clock.count(alone_start, alone_start + WINDOW_S) / WINDOW_S

        attackers = [Attacker(daemon.target, body, ATTACKS_PER_S) for body in attacks]
        try:
            _poll(lambda: all(a.codes for a in attackers), CALL_S * 2, "every attacker's first answer")
            attack_start = time.monotonic()
            health_attacked = _health_latencies(stub, attack_start + WINDOW_S)
            attacked = clock.count(attack_start, attack_start + WINDOW_S) / WINDOW_S
        finally:
            for a in attackers:
                a.close()
        stub.Cancel(inference_pb2.CancelRequest(job_id=job.job_id), timeout=CALL_S)
        clock.thread.join(CALL_S)

    refused = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED}
    for a in attackers:
        assert set(a.codes) <= refused, a.codes
    sent = sum(len(a.codes) for a in attackers)
    before, during = statistics.median(health_alone), statistics.median(health_attacked)
    report = (
        f"stream {alone:.1f} tokens/s alone, {attacked:.1f} under attack ({sent} maximal prompts answered); "
        f"Health median {before * 1e3:.2f} ms before, {during * 1e3:.2f} ms during"
    )
    print(report)  # shown with -s: the figures the closing note quotes
    assert attacked >= KEEP_RATE * alone, report
    assert during <= HEALTH_SLOWDOWN * before, report
    from calculet.client import DaemonClient

    with DaemonClient(daemon.target) as client:
        assert_idle_soon(client)


# ---------------------------------------------------------------- undecodable requests

JUNK = {
    "bad wire type": b"\xff\xff\xff\xff",  # field 31, wire type 7: no such wire type
    "truncated field": b"\x0a\x7f\x01",  # field 1, 127 bytes announced, 1 present
}


def _rpcs() -> Iterator[tuple[str, str]]:
    """(path, kind) of every RPC the daemon serves; kind as grpc's channel methods name them."""
    for method in SERVICE.methods:
        yield _path(method.name), "unary_stream" if method.server_streaming else "unary_unary"
    yield "/grpc.health.v1.Health/Check", "unary_unary"
    yield "/grpc.health.v1.Health/Watch", "unary_stream"
    yield "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", "stream_stream"


@pytest.fixture(scope="module")
def junk_daemon(tmp_path_factory: pytest.TempPathFactory, models_root) -> Iterator[object]:
    with shared_daemon(
        tmp_path_factory.mktemp("junk"), models_root, "--model", "tiny=tiny", "--fault-injection"
    ) as board:
        yield board


@pytest.mark.parametrize("junk", list(JUNK.values()), ids=list(JUNK))
def test_undecodable_request_bytes_are_invalid_argument_on_every_rpc(junk_daemon, junk: bytes) -> None:
    codes = {}
    with grpc.insecure_channel(junk_daemon.target) as channel:  # type: ignore[attr-defined]
        for path, kind in _rpcs():
            call = getattr(channel, kind)(path)  # bytes in, bytes out
            try:
                if kind == "unary_unary":
                    call(junk, timeout=CALL_S)
                else:
                    list(call(iter([junk]) if kind == "stream_stream" else junk, timeout=CALL_S))
                codes[path] = grpc.StatusCode.OK
            except grpc.RpcError as exc:
                codes[path] = exc.code()
        wrong = {p: c for p, c in codes.items() if c is not grpc.StatusCode.INVALID_ARGUMENT}
        assert not wrong, wrong
        health = daemon_pb2_grpc.DaemonStub(channel).Health(observe_pb2.HealthRequest(), timeout=CALL_S)
        assert health.status == health_pb2.HealthCheckResponse.SERVING


# ---------------------------------------------------------------- SIGTERM with a hung job


def test_sigterm_ends_a_hung_job_in_band_and_exits_before_the_job_timeout(start_daemon) -> None:
    daemon = start_daemon(
        "--model", "tiny=tiny", "--time-scale", "1", "--fault-injection",
        "--job-timeout", str(JOB_TIMEOUT_S), "--drain-timeout", "1",
    )  # fmt: skip
    with grpc.insecure_channel(daemon.target) as channel:
        stub = daemon_pb2_grpc.DaemonStub(channel)
        job = stub.Submit(
            inference_pb2.SubmitRequest(
                model="tiny",
                prompt_tokens=[1, 2, 3],
                sampling=inference_pb2.SamplingParams(temperature=0.0),
                stopping=inference_pb2.StoppingParams(max_tokens=200, ignore_eos=True),
            ),
            timeout=CALL_S,
        )
        clock = TokenClock(stub, job.job_id)
        _poll(lambda: bool(clock.arrivals), CALL_S, "the first token (the Wait stream is attached)")
        hang = operate_pb2.FaultSpec(kind=operate_pb2.FAULT_KIND_HANG)  # the next device job
        stub.InjectFault(operate_pb2.InjectFaultRequest(fault=hang), timeout=CALL_S)
        planned = lambda: stub.InjectFault(operate_pb2.InjectFaultRequest(), timeout=CALL_S).planned_faults  # noqa: E731
        _poll(lambda: planned() == 0, CALL_S, "the hang to fire")

        daemon.proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        try:
            daemon.proc.wait(timeout=JOB_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the daemon was still running {JOB_TIMEOUT_S}s (the job timeout) after SIGTERM")
        exited_after = time.monotonic() - sent
        clock.thread.join(CALL_S)
    print(f"exited {exited_after:.1f}s after SIGTERM (job timeout {JOB_TIMEOUT_S:g}s)")

    assert clock.error is None, f"Wait ended with {clock.error.code()} instead of an in-band Final"
    assert clock.final is not None
    assert clock.final.finish_reason == inference_pb2.FINISH_REASON_ERROR
    assert clock.final.error.kind == grpc.StatusCode.UNAVAILABLE.value[0], clock.final
    assert clock.final.usage.completion_tokens == len(clock.arrivals)  # what a resume continues from
    assert exited_after < JOB_TIMEOUT_S
    assert daemon.proc.returncode in (0, -signal.SIGTERM)
