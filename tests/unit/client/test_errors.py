"""gRPC status -> typed domain error, for every status code (built as aio errors, no server)."""

from __future__ import annotations

import grpc
import grpc.aio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from calculet.client.errors import error_from_rpc, retry_after
from calculet.common.error_codes import GRPC_CODE, RETRY_AFTER_KEY
from calculet.common.errors import (
    Aborted,
    CalculetError,
    Cancelled,
    DeadlineExceeded,
    ErrorKind,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    Overloaded,
    PermissionDenied,
    Unauthenticated,
    Unavailable,
)

EXPECTED_CLASS = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.RESOURCE_EXHAUSTED: Overloaded,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.ABORTED: Aborted,
    grpc.StatusCode.CANCELLED: Cancelled,
}


def rpc_error(code: grpc.StatusCode, details: str | None, trailing: tuple[tuple[str, str], ...] = ()) -> grpc.RpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(*trailing), details)


@given(st.sampled_from([c for c in grpc.StatusCode if c is not grpc.StatusCode.OK]), st.text(min_size=1, max_size=40))
def test_every_code_maps_to_its_kind_and_class(code: grpc.StatusCode, details: str) -> None:
    err = error_from_rpc(rpc_error(code, details), "Submit")
    expected = EXPECTED_CLASS.get(code)
    if expected is not None:
        assert type(err) is expected
        assert GRPC_CODE[err.kind] is code
    else:  # UNKNOWN, INTERNAL, UNIMPLEMENTED, DATA_LOSS, OUT_OF_RANGE, ALREADY_EXISTS
        assert type(err) is CalculetError
        assert err.kind is ErrorKind.INTERNAL
        assert code.name in err.message
    # details are kept word for word, whitespace collapsed to one line
    assert " ".join(details.split()) in err.message
    assert "\n" not in err.message


def test_missing_details_name_the_method_and_code() -> None:
    err = error_from_rpc(rpc_error(grpc.StatusCode.NOT_FOUND, None), "GetModel")
    assert isinstance(err, NotFound)
    assert "GetModel" in err.message and "NOT_FOUND" in err.message


@pytest.mark.parametrize(("value", "expected"), [("2.5", 2.5), ("0.001", 0.001), ("17", 17.0)])
def test_resource_exhausted_carries_the_retry_hint(value: str, expected: float) -> None:
    err = error_from_rpc(
        rpc_error(grpc.StatusCode.RESOURCE_EXHAUSTED, "queue full", ((RETRY_AFTER_KEY, value),)), "Submit"
    )
    assert isinstance(err, Overloaded)
    assert err.retry_after_s == pytest.approx(expected)


@pytest.mark.parametrize("value", ["soon", "-1", "nan", "inf", ""])
def test_malformed_retry_hints_fall_back_to_the_default(value: str) -> None:
    err = error_from_rpc(
        rpc_error(grpc.StatusCode.RESOURCE_EXHAUSTED, "queue full", ((RETRY_AFTER_KEY, value),)), "Submit"
    )
    assert isinstance(err, Overloaded)
    assert err.retry_after_s == Overloaded("x").retry_after_s


def test_retry_hint_is_read_from_bytes_and_only_from_its_key() -> None:
    assert retry_after([("other", "9"), (RETRY_AFTER_KEY, b"3.25")]) == 3.25
    assert retry_after([("other", "9")]) is None
    assert retry_after(None) is None


def test_a_retry_hint_on_another_code_is_ignored() -> None:
    err = error_from_rpc(rpc_error(grpc.StatusCode.UNAVAILABLE, "draining", ((RETRY_AFTER_KEY, "5"),)), "Submit")
    assert isinstance(err, Unavailable)
    assert not hasattr(err, "retry_after_s")


def test_an_rpc_error_without_a_status_is_internal() -> None:
    err = error_from_rpc(grpc.RpcError("boom"), "Status")
    assert err.kind is ErrorKind.INTERNAL
    assert "Status" in err.message
