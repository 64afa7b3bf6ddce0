"""Protobuf <-> client types (`calculet.client.convert`): every field of every client type, from a
message with every field set, and requests back and forth (no server)."""

from __future__ import annotations

import pytest
from grpc_health.v1 import health_pb2
from hypothesis import given
from hypothesis import strategies as st

from calculet.client import (
    Aborted,
    CalculetError,
    DeadlineExceeded,
    ErrorKind,
    FinalEvent,
    FinishReason,
    LoadReport,
    ModelInfo,
    ModelLoad,
    ModelState,
    Overloaded,
    SamplingParams,
    ServingStatus,
    Timings,
    TokenChunk,
    TokenLogprob,
    Usage,
)
from calculet.client.convert import (
    error_from_status,
    event_from_pb,
    load_report_from_pb,
    model_info_from_pb,
    model_state_from_pb,
    sampling_from_pb,
    sampling_to_pb,
    serving_status_from_health,
    serving_status_from_pb,
)
from calculet.v1 import common_pb2, inference_pb2, observe_pb2

F32 = st.floats(-1e6, 1e6, width=32)  # exactly representable on the wire
MAYBE_F32 = st.none() | F32


@given(
    seed=st.none() | st.integers(0, 2**64 - 1),
    temperature=MAYBE_F32,
    top_k=st.integers(0, 2**32 - 1),
    top_p=MAYBE_F32,
    min_p=F32,
    repetition_penalty=MAYBE_F32,
    presence_penalty=F32,
    frequency_penalty=F32,
    logprobs=st.none() | st.integers(0, 2**32 - 1),
)
def test_sampling_params_round_trip_field_for_field(**fields: object) -> None:
    params = SamplingParams(**fields)  # type: ignore[arg-type]
    pb = sampling_to_pb(params)
    for name in ("seed", "temperature", "top_p", "repetition_penalty", "logprobs"):
        assert pb.HasField(name) is (fields[name] is not None), f"{name}: None must stay unset on the wire"
    assert not pb.return_logits
    assert sampling_from_pb(pb) == params
    assert sampling_from_pb(inference_pb2.SamplingParams.FromString(pb.SerializeToString())) == params


def test_sampling_params_defaults_are_the_daemons() -> None:
    assert sampling_to_pb(SamplingParams()) == inference_pb2.SamplingParams()
    assert sampling_from_pb(inference_pb2.SamplingParams()) == SamplingParams()


def full_chunk() -> inference_pb2.WaitEvent:
    logprobs = [
        inference_pb2.TokenLogprob(
            token=11,
            logprob=-0.5,
            top=[inference_pb2.TopLogprob(token=11, logprob=-0.5), inference_pb2.TopLogprob(token=3, logprob=-2.0)],
        ),
        inference_pb2.TokenLogprob(token=12, logprob=-0.25),
    ]
    chunk = inference_pb2.TokenChunk(first_index=7, tokens=[11, 12], logprobs=logprobs)
    return inference_pb2.WaitEvent(index=4, tokens=chunk)


def test_a_token_chunk_keeps_every_field() -> None:
    assert event_from_pb(full_chunk()) == TokenChunk(
        index=4,
        first_index=7,
        tokens=(11, 12),
        logprobs=(TokenLogprob(11, -0.5, ((11, -0.5), (3, -2.0))), TokenLogprob(12, -0.25, ())),
    )


def full_final(reason: int, **kw: object) -> inference_pb2.WaitEvent:
    final = inference_pb2.Final(
        finish_reason=reason,  # type: ignore[arg-type]
        usage=inference_pb2.Usage(prompt_tokens=10, completion_tokens=6, cached_tokens=4, resumed_tokens=2),
        timings=inference_pb2.Timings(queue_s=0.125, prefill_s=0.25, ttft_s=0.375, decode_s=0.5, e2e_s=0.875),
        generation=9,
        recoveries=2,
        **kw,  # type: ignore[arg-type]
    )
    return inference_pb2.WaitEvent(index=5, final=final)


def test_a_final_keeps_every_field() -> None:
    event = event_from_pb(full_final(inference_pb2.FINISH_REASON_STOP, stop_token_id=151_645))
    assert event == FinalEvent(
        index=5,
        reason=FinishReason.STOP,
        usage=Usage(prompt_tokens=10, completion_tokens=6, cached_tokens=4, resumed_tokens=2),
        timings=Timings(queue_s=0.125, prefill_s=0.25, ttft_s=0.375, decode_s=0.5, e2e_s=0.875),
        error=None,
        stop_token_id=151_645,
        generation=9,
        recoveries=2,
    )


@pytest.mark.parametrize(
    ("reason", "expected"),
    [
        (inference_pb2.FINISH_REASON_STOP, FinishReason.STOP),
        (inference_pb2.FINISH_REASON_LENGTH, FinishReason.LENGTH),
        (inference_pb2.FINISH_REASON_CANCELLED, FinishReason.CANCELLED),
    ],
)
def test_finish_reasons_without_error(reason: int, expected: FinishReason) -> None:
    event = event_from_pb(full_final(reason))
    assert isinstance(event, FinalEvent)
    assert event.reason is expected and event.error is None and event.stop_token_id is None
    assert expected.value == expected.name.lower()


@pytest.mark.parametrize(
    ("kind", "cls"),
    [
        (common_pb2.ERROR_KIND_ABORTED, Aborted),
        (common_pb2.ERROR_KIND_DEADLINE_EXCEEDED, DeadlineExceeded),
    ],
)
def test_an_error_final_carries_its_typed_error(kind: int, cls: type[CalculetError]) -> None:
    status = common_pb2.ErrorStatus(kind=kind, message="went wrong")  # type: ignore[arg-type]
    event = event_from_pb(full_final(inference_pb2.FINISH_REASON_ERROR, error=status))
    assert isinstance(event, FinalEvent) and event.reason is FinishReason.ERROR
    assert type(event.error) is cls and event.error.message == "went wrong"


@pytest.mark.parametrize("reason", [inference_pb2.FINISH_REASON_ERROR, inference_pb2.FINISH_REASON_UNSPECIFIED, 99])
def test_an_error_or_unknown_final_without_status_is_internal(reason: int) -> None:
    event = event_from_pb(full_final(reason))
    assert isinstance(event, FinalEvent) and event.reason is FinishReason.ERROR
    assert event.error is not None and event.error.kind is ErrorKind.INTERNAL and "no error" in event.error.message


def test_error_status_conversion() -> None:
    busy = error_from_status(
        common_pb2.ErrorStatus(kind=common_pb2.ERROR_KIND_OVERLOADED, message="no room", retry_after_s=0.0)
    )
    assert isinstance(busy, Overloaded) and busy.retry_after_s == 0.0
    default = error_from_status(common_pb2.ErrorStatus(kind=common_pb2.ERROR_KIND_OVERLOADED, message="x"))
    assert isinstance(default, Overloaded) and default.retry_after_s == Overloaded("x").retry_after_s
    for kind in (common_pb2.ERROR_KIND_UNSPECIFIED, 42):
        err = error_from_status(common_pb2.ErrorStatus(kind=kind))  # type: ignore[arg-type]
        assert type(err) is CalculetError and err.kind is ErrorKind.INTERNAL and err.message


def full_summary(**kw: object) -> observe_pb2.ModelSummary:
    fields: dict[str, object] = dict(
        alias="qwen", generation=7, state=common_pb2.MODEL_STATE_WARMING, package_name="qwen3-30b-a3b",
        package_hash="ef" * 32, model_role="llm", family="qwen3_moe", quantization="bf16", vocab_size=151_936,
        context=4096, lanes=16, eos_token_ids=[151_645, 151_643], bos_token_id=0, pad_token_id=151_643,
        model_max_length=4096,
    )  # fmt: skip
    fields.update(kw)
    return observe_pb2.ModelSummary(**fields)  # type: ignore[arg-type]


def test_model_info_keeps_every_field() -> None:
    pb = observe_pb2.GetModelResponse(model=full_summary(), tokenizer_json=b'{"v": 1}', chat_template="{{ x }}")
    assert model_info_from_pb(pb) == ModelInfo(
        alias="qwen", generation=7, state=ModelState.WARMING, package_name="qwen3-30b-a3b", package_hash="ef" * 32,
        family="qwen3_moe", quantization="bf16", vocab_size=151_936, context=4096, lanes=16,
        eos_token_ids=(151_645, 151_643), bos_token_id=0, pad_token_id=151_643, model_max_length=4096,
        tokenizer_json=b'{"v": 1}', chat_template="{{ x }}",
    )  # fmt: skip


def test_absent_special_tokens_are_none_not_zero() -> None:
    summary = full_summary()
    summary.ClearField("bos_token_id")
    summary.ClearField("pad_token_id")
    info = model_info_from_pb(observe_pb2.GetModelResponse(model=summary))
    assert (info.bos_token_id, info.pad_token_id, info.tokenizer_json, info.chat_template) == (None, None, b"", "")


def test_every_model_state_has_a_client_state() -> None:
    for name, number in common_pb2.ModelState.items():
        state = model_state_from_pb(number)
        if name == "MODEL_STATE_UNSPECIFIED":
            assert state is ModelState.UNKNOWN
        else:
            assert state.name == name.removeprefix("MODEL_STATE_") and state.value == state.name.lower()
    assert model_state_from_pb(99) is ModelState.UNKNOWN


def test_load_report_keeps_every_field() -> None:
    pb = observe_pb2.LoadReport(
        board="board-3",
        status=common_pb2.SERVING_STATUS_DRAINING,
        sequence=12,
        models=[
            observe_pb2.ModelLoad(
                alias="a", generation=2, state=common_pb2.MODEL_STATE_READY, ready=True, queue_depth=5, running=3,
                free_lanes=1, lanes_total=4, prefix=observe_pb2.PrefixBlocks(block_tokens=64),
            ),
            observe_pb2.ModelLoad(alias="b", generation=1, state=common_pb2.MODEL_STATE_DRAINING, lanes_total=2),
        ],
    )  # fmt: skip
    pb.timestamp.GetCurrentTime()
    assert load_report_from_pb(pb) == LoadReport(
        board="board-3",
        status=ServingStatus.DRAINING,
        sequence=12,
        models=(
            ModelLoad("a", 2, ModelState.READY, True, queue_depth=5, running=3, free_lanes=1, lanes_total=4),
            ModelLoad(
                "b",
                1,
                ModelState.DRAINING,
                False,
                queue_depth=0,
                running=0,
                free_lanes=0,
                lanes_total=2,
                prefix_reuse=False,
            ),  # no prefix blocks reported: its prefix reuse is off
        ),
    )


def test_serving_statuses() -> None:
    assert serving_status_from_pb(common_pb2.SERVING_STATUS_SERVING) is ServingStatus.SERVING
    assert serving_status_from_pb(common_pb2.SERVING_STATUS_DRAINING) is ServingStatus.DRAINING
    assert serving_status_from_pb(common_pb2.SERVING_STATUS_NOT_SERVING) is ServingStatus.NOT_SERVING
    assert serving_status_from_pb(common_pb2.SERVING_STATUS_UNSPECIFIED) is ServingStatus.NOT_SERVING
    assert serving_status_from_pb(77) is ServingStatus.NOT_SERVING
    health = health_pb2.HealthCheckResponse
    assert serving_status_from_health(health(status=health.SERVING)) is ServingStatus.SERVING
    for status in (health.NOT_SERVING, health.SERVICE_UNKNOWN, health.UNKNOWN):
        assert serving_status_from_health(health(status=status)) is ServingStatus.NOT_SERVING
