"""Every bad input gets a clear error with the right code, and the daemon stays healthy and clean."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import grpc
import pytest

from calculet.client import DaemonClient
from calculet.common.errors import (
    CalculetError,
    Cancelled,
    ErrorKind,
    NotFound,
    PermissionDenied,
)
from calculet.v1 import daemon_pb2_grpc, inference_pb2

from .conftest import shared_daemon
from .helpers import assert_idle_soon

pytestmark = pytest.mark.integration

TINY_CONTEXT = 256


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, models_root) -> Iterator[object]:
    flags = ("--model", "tiny=tiny", "--max-message-bytes", str(1 << 20))
    with shared_daemon(tmp_path_factory.mktemp("bad-input"), models_root, *flags) as board:
        yield board


@pytest.fixture
def client(daemon) -> Iterator[DaemonClient]:
    with DaemonClient(daemon.target) as c:
        yield c
    # After every bad input: still serving, nothing leaked (a cancelled job may need a moment).
    with DaemonClient(daemon.target) as c:
        assert c.health().status == 1  # SERVING
        assert_idle_soon(c)


def _kind(fn: Callable[[], object]) -> ErrorKind:
    with pytest.raises(CalculetError) as info:
        fn()
    return info.value.kind


def _gen(client: DaemonClient, **kw: object) -> Callable[[], object]:
    args: dict[str, object] = {"max_tokens": 4, "temperature": 0.0}
    args.update(kw)
    prompt = args.pop("prompt", [1, 2, 3])
    model = args.pop("model", "tiny")
    return lambda: list(client.generate(model, prompt, **args))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("case", "kwargs", "kind"),
    [
        ("unknown model", {"model": "nope"}, ErrorKind.NOT_FOUND),
        ("token id >= vocab", {"prompt": [1, 512]}, ErrorKind.INVALID_ARGUMENT),
        ("empty prompt", {"prompt": []}, ErrorKind.INVALID_ARGUMENT),
        ("prompt + max tokens beyond context", {"prompt": [1] * 200, "max_tokens": 100}, ErrorKind.INVALID_ARGUMENT),
        ("max tokens 0", {"max_tokens": 0}, ErrorKind.INVALID_ARGUMENT),
        ("max tokens absurd", {"max_tokens": 10**9}, ErrorKind.INVALID_ARGUMENT),
        ("negative temperature", {"temperature": -0.5}, ErrorKind.INVALID_ARGUMENT),
        ("NaN temperature", {"temperature": math.nan}, ErrorKind.INVALID_ARGUMENT),
        ("top_p zero", {"top_p": 0.0, "temperature": 1.0}, ErrorKind.INVALID_ARGUMENT),
        ("top_p above one", {"top_p": 1.5, "temperature": 1.0}, ErrorKind.INVALID_ARGUMENT),
        # the client leaves these value checks to the daemon (it only checks what protobuf cannot carry)
        ("logprobs above 20", {"logprobs": 21}, ErrorKind.INVALID_ARGUMENT),
        ("top_k above vocab", {"top_k": 513, "temperature": 1.0}, ErrorKind.INVALID_ARGUMENT),
        ("infinite temperature", {"temperature": math.inf}, ErrorKind.INVALID_ARGUMENT),
    ],
)
def test_bad_request_is_refused_with_its_code(client: DaemonClient, case: str, kwargs: dict, kind: ErrorKind) -> None:
    assert _kind(_gen(client, **kwargs)) is kind, case


def test_unknown_job_id_is_not_found(client: DaemonClient) -> None:
    with pytest.raises(NotFound):
        list(client.wait("no-such-job"))
    with pytest.raises(NotFound):
        client.cancel("no-such-job")


def test_wait_on_a_cancelled_job_is_cancelled(start_daemon) -> None:
    # A board of its own at time scale 1: the 200-token job runs for over 3 s, so the cancel finds
    # it running however fast the machine. At time scale 0 it ends in about 0.5 s (less on a faster
    # machine); a cancel after its Final cancels nothing, and Wait replays the finished job.
    paced = start_daemon("--model", "tiny=tiny", "--time-scale", "1")
    with DaemonClient(paced.target) as client:
        g = client.generate("tiny", [1, 2, 3], max_tokens=200, temperature=0.0, ignore_eos=True)
        job_id = g.job_id
        client.cancel(job_id)
        with pytest.raises(Cancelled):
            list(client.wait(job_id))
        assert client.health().status == 1  # SERVING
        assert_idle_soon(client)


def test_oversized_message_is_resource_exhausted(daemon) -> None:
    # 1 MiB server limit; a raw stub so the client library's own checks cannot intervene.
    with grpc.insecure_channel(daemon.target) as channel:
        stub = daemon_pb2_grpc.DaemonStub(channel)
        req = inference_pb2.SubmitRequest(model="tiny", prompt_tokens=[100_000] * 400_000)  # ~1.2 MB
        with pytest.raises(grpc.RpcError) as info:
            stub.Submit(req, timeout=10)
    assert info.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED


def test_load_outside_models_root_is_permission_denied(client: DaemonClient) -> None:
    with pytest.raises(PermissionDenied):
        client.load_and_wait("evil", "../../etc")
    with pytest.raises(PermissionDenied):
        client.load_and_wait("evil", "/etc")
