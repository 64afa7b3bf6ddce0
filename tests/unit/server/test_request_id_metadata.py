"""The Submit call's `x-request-id` and W3C trace metadata: carried into the domain request (logs and
spans), never part of its identity, and a malformed request id refused with INVALID_ARGUMENT."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from calculet.common.errors import InvalidArgument
from calculet.daemon.core.request import NO_TRACE, RequestTrace
from calculet.daemon.wire import MAX_ID_BYTES, trace_from_metadata
from calculet.v1 import inference_pb2
from tests.unit.core.engine_factories import build_models, running_core
from tests.unit.server.served_core import CALL_S, ServedCore

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_trace_from_metadata_reads_the_three_keys_and_checks_the_request_id() -> None:
    got = trace_from_metadata((("x-request-id", "abc-1"), ("traceparent", TRACEPARENT), ("tracestate", "k=v")))
    assert got == RequestTrace("abc-1", TRACEPARENT, "k=v")
    assert trace_from_metadata(()) == NO_TRACE and trace_from_metadata(None) == NO_TRACE
    assert trace_from_metadata((("tracestate", "x" * 513),)).tracestate == "", "too long: dropped (W3C allows it)"
    assert trace_from_metadata((("x-request-id", "r" * MAX_ID_BYTES),)).request_id == "r" * MAX_ID_BYTES
    for bad in ("r" * (MAX_ID_BYTES + 1), "tab\there", "caf\u00e9"):
        with pytest.raises(InvalidArgument, match="x-request-id"):
            trace_from_metadata((("x-request-id", bad),))


@pytest.fixture(scope="module")
def board(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedCore]:
    models: Path = build_models(tmp_path_factory.mktemp("models"))
    with running_core(models) as core:
        served = ServedCore(core, tmp_path_factory.mktemp("sock") / "d.sock")
        try:
            yield served
        finally:
            served.close()


def _submit(board: ServedCore, metadata: tuple[tuple[str, str], ...], client_request_id: str = "") -> str:
    req = inference_pb2.SubmitRequest(
        model="tiny", prompt_tokens=[1, 2, 3], client_request_id=client_request_id,
        stopping=inference_pb2.StoppingParams(max_tokens=2),
    )  # fmt: skip
    return str(board.stub.Submit(req, timeout=CALL_S, metadata=metadata).job_id)


def test_a_malformed_request_id_is_refused_and_the_board_serves_on(board: ServedCore) -> None:
    with pytest.raises(grpc.RpcError) as info:
        _submit(board, (("x-request-id", "r" * (MAX_ID_BYTES + 1)),))
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "x-request-id" in (info.value.details() or "")
    assert _submit(board, (("x-request-id", "fine-1"),))


def test_a_retry_with_another_request_id_or_trace_is_the_same_job(board: ServedCore) -> None:
    first = _submit(board, (("x-request-id", "attempt-1"),), client_request_id="idem-7")
    again = _submit(board, (("x-request-id", "attempt-2"), ("traceparent", TRACEPARENT)), client_request_id="idem-7")
    assert again == first
