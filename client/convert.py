"""Protobuf <-> client types (`calculet.client.types`): the client's half of the wire.

Requests: `SamplingParams` <-> `inference_pb2.SamplingParams` (None fields stay unset, so the daemon
applies its defaults and picks the seed). Answers: `WaitEvent` -> `TokenChunk` / `FinalEvent` (an
in-band `ErrorStatus` becomes the typed `CalculetError`), GetModel's stream of `GetModelResponse`s
(tokenizer.json in pieces, joined) -> `ModelInfo`, `LoadReport` -> `LoadReport`, and the standard
health status -> `ServingStatus`. The daemon has its own conversions to its domain types
(`calculet.daemon.wire`); this module imports none of them, only the generated messages and the
shared error table (`calculet.common.error_codes`).
"""

from __future__ import annotations

from collections.abc import Sequence

from grpc_health.v1 import health_pb2

from calculet.client.types import (
    Constraint,
    Event,
    FinalEvent,
    FinishReason,
    LoadReport,
    ModelInfo,
    ModelLoad,
    ModelState,
    SamplingParams,
    ServingStatus,
    ThinkingBudget,
    Timings,
    TokenChunk,
    TokenLogprob,
    Usage,
)
from calculet.common.error_codes import error_from_kind, kind_from_pb
from calculet.common.errors import CalculetError, ErrorKind
from calculet.common.prefix import BLOCK_TOKENS
from calculet.v1 import common_pb2, inference_pb2, observe_pb2

_FINISH: dict[int, FinishReason] = {
    inference_pb2.FINISH_REASON_STOP: FinishReason.STOP,
    inference_pb2.FINISH_REASON_LENGTH: FinishReason.LENGTH,
    inference_pb2.FINISH_REASON_CANCELLED: FinishReason.CANCELLED,
    inference_pb2.FINISH_REASON_ERROR: FinishReason.ERROR,
}
_SERVING: dict[int, ServingStatus] = {
    common_pb2.SERVING_STATUS_SERVING: ServingStatus.SERVING,
    common_pb2.SERVING_STATUS_DRAINING: ServingStatus.DRAINING,
    common_pb2.SERVING_STATUS_NOT_SERVING: ServingStatus.NOT_SERVING,
}


# ---- requests ------------------------------------------------------------------------------


def sampling_to_pb(params: SamplingParams) -> inference_pb2.SamplingParams:
    """The wire form of `params`; None fields are left unset (the daemon's defaults apply)."""
    pb = inference_pb2.SamplingParams(
        top_k=params.top_k,
        min_p=params.min_p,
        presence_penalty=params.presence_penalty,
        frequency_penalty=params.frequency_penalty,
    )
    if params.seed is not None:
        pb.seed = params.seed
    if params.temperature is not None:
        pb.temperature = params.temperature
    if params.top_p is not None:
        pb.top_p = params.top_p
    if params.repetition_penalty is not None:
        pb.repetition_penalty = params.repetition_penalty
    if params.logprobs is not None:
        pb.logprobs = params.logprobs
    if params.constraint is not None:
        pb.constraint.CopyFrom(constraint_to_pb(params.constraint))
    if params.thinking is not None:
        t = params.thinking
        pb.thinking.CopyFrom(
            inference_pb2.ThinkingBudget(
                budget=t.budget, open_token_id=t.open_token_id, close_token_id=t.close_token_id
            )
        )
    return pb


def constraint_to_pb(c: Constraint) -> inference_pb2.Constraint:
    """The wire form of a `Constraint` (its `kind` is the oneof field's name)."""
    if c.kind == "json_object":
        return inference_pb2.Constraint(json_object=True)
    if c.kind == "choice":
        return inference_pb2.Constraint(choice=inference_pb2.ConstraintChoice(options=list(c.choices)))
    pb = inference_pb2.Constraint()
    setattr(pb, c.kind, c.text)  # json_schema, regex or lark: the kind names the oneof field
    return pb


def constraint_from_pb(pb: inference_pb2.Constraint) -> Constraint | None:
    """The client form of a wire Constraint (None when no field is set)."""
    which = pb.WhichOneof("kind")
    if which is None:
        return None
    if which == "json_object":
        return Constraint("json_object")
    if which == "choice":
        return Constraint("choice", choices=tuple(pb.choice.options))
    return Constraint(which, getattr(pb, which))


def sampling_from_pb(pb: inference_pb2.SamplingParams) -> SamplingParams:
    """The client form of a wire SamplingParams (unset optional fields read as None).

    Floats travel as 32-bit values, so a round trip keeps them to float32 precision.
    """
    return SamplingParams(
        seed=pb.seed if pb.HasField("seed") else None,
        temperature=pb.temperature if pb.HasField("temperature") else None,
        top_k=pb.top_k,
        top_p=pb.top_p if pb.HasField("top_p") else None,
        min_p=pb.min_p,
        repetition_penalty=pb.repetition_penalty if pb.HasField("repetition_penalty") else None,
        presence_penalty=pb.presence_penalty,
        frequency_penalty=pb.frequency_penalty,
        logprobs=pb.logprobs if pb.HasField("logprobs") else None,
        constraint=constraint_from_pb(pb.constraint) if pb.HasField("constraint") else None,
        thinking=thinking_from_pb(pb.thinking) if pb.HasField("thinking") else None,
    )


def thinking_from_pb(pb: inference_pb2.ThinkingBudget) -> ThinkingBudget:
    return ThinkingBudget(pb.budget, pb.open_token_id, pb.close_token_id)


# ---- errors --------------------------------------------------------------------------------


def error_from_status(status: common_pb2.ErrorStatus) -> CalculetError:
    """Rebuild the typed error an in-band ErrorStatus (Final, LoadProgress, ResetResult) describes.

    An unknown or missing kind (a newer or broken daemon) becomes INTERNAL rather than a crash;
    OVERLOADED keeps `retry_after_s` (or the default when unset).
    """
    known = status.kind != common_pb2.ERROR_KIND_UNSPECIFIED and status.kind in common_pb2.ErrorKind.values()
    kind = kind_from_pb(status.kind) if known else ErrorKind.INTERNAL
    message = status.message or f"the daemon reported {kind.value} without a message"
    retry_after_s = status.retry_after_s if status.HasField("retry_after_s") else None
    return error_from_kind(kind, message, retry_after_s)


# ---- Wait events ---------------------------------------------------------------------------


def event_from_pb(pb: inference_pb2.WaitEvent) -> Event:
    """A Wait event as a `TokenChunk` or a `FinalEvent`.

    A Final with an unknown finish reason reads as ERROR; an ERROR Final without its ErrorStatus
    gets an INTERNAL error, so `FinalEvent.error` is set whenever the reason is ERROR.
    """
    if pb.WhichOneof("event") == "tokens":
        t = pb.tokens
        logprobs = tuple(
            TokenLogprob(lp.token, lp.logprob, tuple((x.token, x.logprob) for x in lp.top)) for lp in t.logprobs
        )
        return TokenChunk(pb.index, t.first_index, tuple(t.tokens), logprobs)
    return final_from_pb(pb.index, pb.final)


def final_from_pb(index: int, f: inference_pb2.Final) -> FinalEvent:
    """The `FinalEvent` of event `index` (see `event_from_pb`)."""
    reason = _FINISH.get(f.finish_reason, FinishReason.ERROR)
    error = error_from_status(f.error) if f.HasField("error") else None
    if reason is FinishReason.ERROR and error is None:
        error = CalculetError(
            f"the job ended with finish reason {_finish_name(f.finish_reason)} and no error", kind=ErrorKind.INTERNAL
        )
    u, t = f.usage, f.timings
    return FinalEvent(
        index=index,
        reason=reason,
        usage=Usage(u.prompt_tokens, u.completion_tokens, u.cached_tokens, u.resumed_tokens),
        timings=Timings(t.queue_s, t.prefill_s, t.ttft_s, t.decode_s, t.e2e_s),
        error=error,
        stop_token_id=f.stop_token_id if f.HasField("stop_token_id") else None,
        generation=f.generation,
        recoveries=f.recoveries,
    )


def _finish_name(value: int) -> str:
    try:
        return inference_pb2.FinishReason.Name(value)
    except ValueError:
        return str(value)


# ---- observation plane ---------------------------------------------------------------------


def model_state_from_pb(value: int) -> ModelState:
    """A wire ModelState number; unspecified or unknown ones read as `ModelState.UNKNOWN`."""
    try:
        name = common_pb2.ModelState.Name(value).removeprefix("MODEL_STATE_")
    except ValueError:
        return ModelState.UNKNOWN
    return ModelState.__members__.get(name, ModelState.UNKNOWN)


def serving_status_from_pb(value: int) -> ServingStatus:
    """A wire ServingStatus number; unspecified or unknown ones read as NOT_SERVING (route elsewhere)."""
    return _SERVING.get(value, ServingStatus.NOT_SERVING)


def serving_status_from_health(pb: health_pb2.HealthCheckResponse) -> ServingStatus:
    """A `grpc.health.v1` answer: SERVING -> SERVING; NOT_SERVING, SERVICE_UNKNOWN, UNKNOWN -> NOT_SERVING.

    (The daemon publishes a draining board as NOT_SERVING there; `LoadReport.status` tells DRAINING apart.)
    """
    return ServingStatus.SERVING if pb.status == health_pb2.HealthCheckResponse.SERVING else ServingStatus.NOT_SERVING


def model_info_from_stream(messages: Sequence[observe_pb2.GetModelResponse]) -> ModelInfo:
    """GetModel's whole stream as a `ModelInfo`: the first message's fields, with the pieces of
    tokenizer.json of every message joined in order.

    Raises:
        CalculetError (INTERNAL): no message, or the pieces do not add up to `tokenizer_size` (a
            daemon before the stream left it 0 and sent the whole file in its one message).
    """
    if not messages or not messages[0].HasField("model"):
        raise CalculetError("GetModel: the stream did not start with the model summary", kind=ErrorKind.INTERNAL)
    first = messages[0]
    data = b"".join(m.tokenizer_json for m in messages)
    if first.tokenizer_size and len(data) != first.tokenizer_size:
        raise CalculetError(
            f"GetModel: tokenizer.json arrived with {len(data)} of {first.tokenizer_size} bytes",
            kind=ErrorKind.INTERNAL,
        )
    return _model_info(first.model, data, first.chat_template)


def model_info_from_pb(pb: observe_pb2.GetModelResponse) -> ModelInfo:
    """One GetModel message holding the whole tokenizer.json as a `ModelInfo`."""
    return _model_info(pb.model, pb.tokenizer_json, pb.chat_template)


def _model_info(m: observe_pb2.ModelSummary, tokenizer_json: bytes, chat_template: str) -> ModelInfo:
    return ModelInfo(
        alias=m.alias,
        generation=m.generation,
        state=model_state_from_pb(m.state),
        package_name=m.package_name,
        package_hash=m.package_hash,
        family=m.family,
        quantization=m.quantization,
        vocab_size=m.vocab_size,
        context=m.context,
        lanes=m.lanes,
        eos_token_ids=tuple(m.eos_token_ids),
        bos_token_id=m.bos_token_id if m.HasField("bos_token_id") else None,
        pad_token_id=m.pad_token_id if m.HasField("pad_token_id") else None,
        model_max_length=m.model_max_length,
        tokenizer_json=tokenizer_json,
        chat_template=chat_template,
        prefill_fixed_ms=m.prefill_fixed_ms,
        prefill_ms_per_token=m.prefill_ms_per_token,
        decode_step_ms=m.decode_step_ms,
        prefill_chunk_tokens=m.prefill_chunk_tokens,
    )


def load_report_from_pb(pb: observe_pb2.LoadReport) -> LoadReport:
    """One WatchLoad message as a `LoadReport`."""
    models = tuple(
        ModelLoad(
            alias=m.alias,
            generation=m.generation,
            state=model_state_from_pb(m.state),
            ready=m.ready,
            queue_depth=m.queue_depth,
            running=m.running,
            free_lanes=m.free_lanes,
            lanes_total=m.lanes_total,
            parked_lanes=m.parked_lanes,
            pending_prefill_tokens=m.pending_prefill_tokens,
            prefix_hashes=_prefix_hashes(m.prefix),
            prefix_truncated=m.prefix.truncated,
            package_hash=m.package_hash,
            prefix_tips=frozenset(m.prefix.lane_tips) if m.prefix.block_tokens == BLOCK_TOKENS else frozenset(),
            pending_short_prefill_tokens=m.pending_short_prefill_tokens,
            short_prefill_tokens=m.short_prefill_tokens,
            queue_limit=m.queue_limit,
            prefix_reuse=m.HasField("prefix"),
        )
        for m in pb.models
    )
    return LoadReport(board=pb.board, status=serving_status_from_pb(pb.status), sequence=pb.sequence, models=models)


def _prefix_hashes(pb: observe_pb2.PrefixBlocks) -> frozenset[int]:
    """The advertised block hashes, or none when the daemon hashes blocks of another size than this
    client (a protocol mismatch: matching them would be wrong, so the router sees no prefix)."""
    if pb.block_tokens != BLOCK_TOKENS:
        return frozenset()
    return frozenset(pb.hashes)
