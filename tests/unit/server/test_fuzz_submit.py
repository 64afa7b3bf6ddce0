"""Fuzzing Submit over the real servicer: raw request bytes, both well-formed `SubmitRequest`s built
from hostile field values (extreme ints, NaN/inf/negative floats, empty and huge prompts, long and
unicode strings, unknown fields) and arbitrary bytes, sent through a raw unary-unary call so nothing
on the client side checks them. Every call ends OK or with a clear client-facing code, never INTERNAL
or UNKNOWN; accepted jobs are cancelled, and afterwards the board still answers Health SERVING and
its engine holds no job."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2_grpc
from grpc_health.v1.health import aio as health_aio  # type: ignore[attr-defined]  # untyped re-export
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from calculet.daemon.core.config import DaemonConfig
from calculet.daemon.core.device_core import DeviceCore
from calculet.daemon.server.app import DEFAULT_MAX_MESSAGE_BYTES, MAX_SEND_BYTES
from calculet.daemon.server.errors import StrictDecoding
from calculet.daemon.server.servicer import DaemonServicer
from calculet.ops.sim_packages.build import build_sim_package
from calculet.v1 import common_pb2, daemon_pb2_grpc, inference_pb2, observe_pb2

from .served_core import ServedCore

CALL_S = 10.0
ALLOWED = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
}
FUZZ = settings(
    deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture], max_examples=150
)


class DaemonServedCore(ServedCore):
    """`ServedCore` with the daemon's own server set-up (`server/app.py` `serve`): its message limits
    and the `StrictDecoding` interceptor that turns undecodable requests into INVALID_ARGUMENT.
    (The bare `ServedCore` server answers UNKNOWN for bytes that do not parse, as plain grpc does.)"""

    async def _start(self) -> None:
        options = [
            ("grpc.max_receive_message_length", DEFAULT_MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_SEND_BYTES),
        ]
        self._server = grpc.aio.server(options=options, interceptors=[StrictDecoding()])
        health = health_aio.HealthServicer()
        servicer = DaemonServicer(self.core, health)
        daemon_pb2_grpc.add_DaemonServicer_to_server(servicer, self._server)
        health_pb2_grpc.add_HealthServicer_to_server(health, self._server)
        self._server.add_insecure_port(self.target)
        await self._server.start()
        await servicer.sync_health()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedCore]:
    root = tmp_path_factory.mktemp("models")
    build_sim_package("tiny", root / "tiny")
    config = DaemonConfig(
        models_root=root, models=(("tiny", "tiny"),), device_options={"time_scale": 0.0, "profile": "calsim-dev"}
    )
    core = DeviceCore(config)
    core.start()
    board = DaemonServedCore(core, tmp_path_factory.mktemp("sock") / "d.sock")
    yield board
    board.close()


U32 = st.one_of(st.integers(0, 2**32 - 1), st.sampled_from([0, 1, 2, 255, 256, 511, 512, 513, 2**31, 2**32 - 1]))
I32 = st.one_of(st.integers(-(2**31), 2**31 - 1), st.sampled_from([-1001, -1000, 0, 1000, 1001]))
U64 = st.one_of(st.integers(0, 2**64 - 1), st.just(2**64 - 1))
FLOATS = st.one_of(
    st.floats(width=32, allow_nan=True, allow_infinity=True),
    st.sampled_from([math.nan, math.inf, -math.inf, -0.0, 0.0, -1.0, 1e-45, 2.0, 2.0000002, 3.4e38]),
)
TOKENS = st.one_of(
    st.lists(st.integers(0, 600), max_size=300),
    st.lists(U32, max_size=20),
    st.sampled_from([[], [0] * 255, [1] * 256, [7] * 100_000, [1] * 300_000]),
)
TEXT = st.one_of(
    st.text(max_size=200),
    st.sampled_from(["tiny", "", "é" * 64, "é" * 65, "s" * 128, "s" * 129, "x" * 100_000, "\x00", "tiny\x00"]),
)
MODEL = st.one_of(st.sampled_from(["tiny", "tiny", "", "TINY", "nope", "t" * 10_000, "tiny\n", "🙂"]), TEXT)


def _maybe(strategy: st.SearchStrategy) -> st.SearchStrategy:  # type: ignore[type-arg]
    return st.none() | strategy


@st.composite
def sampling(draw: st.DrawFn) -> inference_pb2.SamplingParams:
    fields = {
        "seed": draw(_maybe(U64)),
        "temperature": draw(_maybe(FLOATS)),
        "top_k": draw(U32),
        "top_p": draw(_maybe(FLOATS)),
        "min_p": draw(FLOATS),
        "repetition_penalty": draw(_maybe(FLOATS)),
        "presence_penalty": draw(FLOATS),
        "frequency_penalty": draw(FLOATS),
        "logprobs": draw(_maybe(U32)),
        "return_logits": draw(st.booleans()),
    }
    return inference_pb2.SamplingParams(**{k: v for k, v in fields.items() if v is not None})


@st.composite
def stopping(draw: st.DrawFn) -> inference_pb2.StoppingParams:
    max_tokens = draw(_maybe(st.one_of(U32, st.integers(1, 8))))
    params = inference_pb2.StoppingParams(
        stop_token_ids=draw(st.lists(U32, max_size=70)), ignore_eos=draw(st.booleans())
    )
    if max_tokens is not None:
        params.max_tokens = max_tokens
    return params


@st.composite
def submit_requests(draw: st.DrawFn) -> bytes:
    req = inference_pb2.SubmitRequest(
        model=draw(MODEL),
        client_request_id=draw(st.one_of(st.just(""), TEXT)),
        prompt_tokens=draw(TOKENS),
        resume_tokens=draw(st.one_of(st.just([]), TOKENS)),
        priority=draw(I32),
        session_id=draw(st.one_of(st.just(""), TEXT)),
    )
    if draw(st.booleans()):
        req.sampling.CopyFrom(draw(sampling()))
    if draw(st.booleans()):
        req.stopping.CopyFrom(draw(stopping()))
    deadline = draw(_maybe(st.one_of(U32, st.integers(1, 50))))
    if deadline is not None:
        req.deadline_ms = deadline
    data = req.SerializeToString()
    # Unknown fields (a newer client's): a varint, a length-delimited blob, a fixed64.
    extra = draw(st.sampled_from([b"", b"\xf8\x06\x01", b"\x82\x07\x03abc", b"\x89\x07" + bytes(8)]))
    return data + extra


RAW = st.one_of(submit_requests(), submit_requests(), st.binary(max_size=300))


def _submit_raw(served: ServedCore, data: bytes) -> tuple[grpc.StatusCode, inference_pb2.SubmitResponse | None]:
    call = served.channel.unary_unary(
        "/calculet.v1.Daemon/Submit",
        request_serializer=lambda b: b,
        response_deserializer=inference_pb2.SubmitResponse.FromString,
    )
    try:
        return grpc.StatusCode.OK, call(data, timeout=CALL_S)
    except grpc.RpcError as err:
        return err.code(), None  # type: ignore[attr-defined]  # a grpc.Call as well


def _assert_still_serving(served: ServedCore) -> None:
    health = served.stub.Health(observe_pb2.HealthRequest(), timeout=CALL_S)
    assert health.status == common_pb2.SERVING_STATUS_SERVING
    assert served.core.engine.wait_drained(CALL_S) == 0
    deadline = time.monotonic() + CALL_S
    while not served.core.engine.idle():
        assert time.monotonic() < deadline, "the engine still holds a job after every one was cancelled"
        time.sleep(0.01)


@FUZZ
@given(data=RAW)
@example(data=b"")
@example(data=inference_pb2.SubmitRequest(model="tiny", prompt_tokens=[5]).SerializeToString())
@example(data=b"\x0a\x80\x80\x80\x80\x10")  # a length beyond the message
@example(data=b"\x0a\x02\xff\xfe")  # model: invalid UTF-8
@example(data=b"\x1a\x05\xff\xff\xff\xff\x7f")  # packed prompt_tokens: a varint above uint32
@example(data=b"\x2a\x05\x15\x00\x00\xc0\x7f")  # sampling.temperature = NaN
def test_any_submit_bytes_get_a_clear_answer_never_internal(served: ServedCore, data: bytes) -> None:
    code, response = _submit_raw(served, data)
    assert code in ALLOWED, f"Submit answered {code} to {data[:200]!r}"
    if response is not None:
        assert response.job_id
        cancel = inference_pb2.CancelRequest(job_id=response.job_id)
        served.stub.Cancel(cancel, timeout=CALL_S)


def test_the_board_still_serves_after_the_fuzzing(served: ServedCore) -> None:
    """Runs after the two above (file order): Health SERVING, no job left, and a plain job completes."""
    _assert_still_serving(served)
    request = inference_pb2.SubmitRequest(
        model="tiny",
        prompt_tokens=[5, 6, 7],
        stopping=inference_pb2.StoppingParams(max_tokens=4, ignore_eos=True),
        sampling=inference_pb2.SamplingParams(temperature=0.0),
    )
    job = served.stub.Submit(request, timeout=CALL_S).job_id
    events = list(served.stub.Wait(inference_pb2.WaitRequest(job_id=job), timeout=CALL_S))
    assert events[-1].final.finish_reason == inference_pb2.FINISH_REASON_LENGTH
    _assert_still_serving(served)
