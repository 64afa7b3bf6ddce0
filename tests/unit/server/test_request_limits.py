"""Issue 7 items 2 and 10a at the transport: the receive limit is derived from the largest valid
request (and every valid request fits it), Submit's size checks are O(1) and come before any token id
is read, a large prompt is converted and checked on Submit's pool (never on the event loop),
over-long job ids are refused before any lookup, and `StrictDecoding` leaves handlers it cannot wrap
alone. The behaviour against a real daemon is in tests/integration/test_daemon_transport.py.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from calculet.common.errors import InvalidArgument, NotFound
from calculet.daemon.core.config import DaemonConfig
from calculet.daemon.core.device_core import DeviceCore
from calculet.daemon.sampling.constraint import MAX_CHOICES, MAX_GRAMMAR_BYTES, check_sizes
from calculet.daemon.sampling.thinking import MAX_THINKING_BUDGET
from calculet.daemon.server import app
from calculet.daemon.server import servicer as servicer_module
from calculet.daemon.server.checks import MAX_PATH_BYTES, REFERENCE_CONTEXT, job_id, request_bytes
from calculet.daemon.server.errors import strict_handler
from calculet.daemon.wire import check_submit_sizes
from calculet.ops.sim_packages.build import build_sim_package
from calculet.v1 import inference_pb2, operate_pb2
from tests.unit.server.test_servicer_contract import ServedCore

LARGEST_ID = 2**32 - 1  # a 5-byte varint: the bound must hold whatever the vocabulary


def _largest_valid_submit(context: int) -> inference_pb2.SubmitRequest:
    """Every field at the largest size its wire limit allows, prompt + resume filling the context."""
    return inference_pb2.SubmitRequest(
        model="m" * 128,
        client_request_id="c" * 128,
        session_id="s" * 128,
        prompt_tokens=[LARGEST_ID] * (context - 1),
        resume_tokens=[LARGEST_ID],
        sampling=inference_pb2.SamplingParams(
            seed=2**64 - 1,
            temperature=1.5,
            top_k=LARGEST_ID,
            top_p=0.5,
            min_p=0.5,
            repetition_penalty=1.5,
            presence_penalty=-2.0,
            frequency_penalty=-2.0,
            logprobs=20,
            return_logits=True,
            # The framing-heaviest constraint: every choice, one holding nearly all the bytes.
            constraint=inference_pb2.Constraint(
                choice=inference_pb2.ConstraintChoice(
                    options=["x" * (MAX_GRAMMAR_BYTES - 255 * 4)] + ["yyyy"] * (MAX_CHOICES - 1)
                )
            ),
            thinking=inference_pb2.ThinkingBudget(
                budget=MAX_THINKING_BUDGET, open_token_id=LARGEST_ID - 1, close_token_id=LARGEST_ID
            ),
        ),
        stopping=inference_pb2.StoppingParams(max_tokens=LARGEST_ID, stop_token_ids=[LARGEST_ID] * 64, ignore_eos=True),
        priority=-1000,  # a negative int32 is a 10-byte varint
        deadline_ms=LARGEST_ID,
    )


@pytest.mark.parametrize("context", [1, 256, 4096, REFERENCE_CONTEXT, 131_072])
def test_the_largest_valid_submit_fits_the_derived_limit(context: int) -> None:
    choices = _largest_valid_submit(context).sampling.constraint.choice.options
    check_sizes("choice", "", choices)  # within the bounds: the largest valid constraint
    size = _largest_valid_submit(context).ByteSize()
    assert size <= request_bytes(context)
    assert request_bytes(context) - size < 8192  # derived, not a guess: little is left over


def test_the_default_receive_limit_is_what_a_40960_token_context_needs() -> None:
    assert app.DEFAULT_MAX_MESSAGE_BYTES == request_bytes(40_960) == 279_568
    # The old 4 MiB held a 4.19M-token prompt; the limit is 15 times smaller (19 before a Submit could
    # carry a 64 KiB constraint).
    assert app.DEFAULT_MAX_MESSAGE_BYTES < 4 * 1024 * 1024 // 15
    # No answer larger than a stock client takes (GetModel streams tokenizer.json in pieces below it).
    assert app.MAX_SEND_BYTES == 4 * 1024 * 1024


def test_every_other_request_fits_the_limit_too() -> None:
    load = operate_pb2.LoadRequest(alias="a" * 128, package="p" * MAX_PATH_BYTES)
    assert load.ByteSize() <= request_bytes(1)


def test_submit_sizes_are_refused_before_any_token_id_is_read() -> None:
    huge = inference_pb2.SubmitRequest(model="m", prompt_tokens=[7] * 300_000, resume_tokens=[7] * 10)
    with pytest.raises(InvalidArgument, match=r"prompt_tokens \+ resume_tokens: 300010 tokens"):
        check_submit_sizes(huge, REFERENCE_CONTEXT)
    stops = inference_pb2.SubmitRequest(
        prompt_tokens=[1], stopping=inference_pb2.StoppingParams(stop_token_ids=[1] * 65)
    )
    with pytest.raises(InvalidArgument, match="stop_token_ids"):
        check_submit_sizes(stops, REFERENCE_CONTEXT)
    check_submit_sizes(inference_pb2.SubmitRequest(prompt_tokens=[1] * 255, resume_tokens=[1]), 256)


def test_a_job_id_longer_than_any_issued_is_not_found_without_echoing_it() -> None:
    assert job_id("x" * 64) == "x" * 64
    with pytest.raises(NotFound) as info:
        job_id("x" * 100_000)
    assert "xxxx" not in str(info.value)


def test_a_sync_handler_is_left_as_it_is() -> None:
    handler = grpc.unary_unary_rpc_method_handler(lambda request, context: request, request_deserializer=bytes)
    assert strict_handler(handler, "/x.Y/Z") is handler


# ---------------------------------------------------------------- Submit off the event loop


@pytest.fixture(scope="module")
def qwen_board(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedCore]:
    root = tmp_path_factory.mktemp("models")
    build_sim_package("qwen3-30b-a3b", root / "qwen", decode_batches=(1,), lanes=2, lane_context=2048)
    config = DaemonConfig(models_root=root, models=(("qwen", "qwen"),), device_options={"time_scale": 0.0})
    core = DeviceCore(config)
    core.start()
    board = ServedCore(core, tmp_path_factory.mktemp("sock") / "d.sock")
    yield board
    board.close()


def test_a_large_prompt_is_converted_and_checked_off_the_event_loop(
    qwen_board: ServedCore, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads: list[str] = []
    convert = servicer_module._checked_request

    def spy(request: inference_pb2.SubmitRequest, limits: Any, trace: Any) -> Any:
        threads.append(threading.current_thread().name)
        return convert(request, limits, trace)

    monkeypatch.setattr(servicer_module, "_checked_request", spy)
    stub = qwen_board.stub
    large = servicer_module.INLINE_TOKENS + 500
    stopping = inference_pb2.StoppingParams(max_tokens=1)
    small = inference_pb2.SubmitRequest(model="qwen", prompt_tokens=[1, 2, 3], stopping=stopping)
    valid = inference_pb2.SubmitRequest(model="qwen", prompt_tokens=[7] * large, stopping=stopping)
    bad = inference_pb2.SubmitRequest(model="qwen", prompt_tokens=[7] * (large - 1) + [10**9], stopping=stopping)
    jobs = [stub.Submit(small, timeout=20).job_id, stub.Submit(valid, timeout=20).job_id]
    with pytest.raises(grpc.RpcError) as info:
        stub.Submit(bad, timeout=20)
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert f"prompt_tokens[{large - 1}]" in (info.value.details() or "")
    for job in jobs:  # both run to their one token
        *_, last = stub.Wait(inference_pb2.WaitRequest(job_id=job), timeout=20)
        assert last.final.finish_reason == inference_pb2.FINISH_REASON_LENGTH
    loop_thread = "review-server"  # ServedCore's event loop thread
    assert threads[0] == loop_thread  # a small request costs less than a hop
    assert all(name.startswith("calculet-submit") for name in threads[1:]), threads
