"""The daemon's one place where protobuf meets domain objects (requests, events, errors).

The servicer converts through here (and `wire_views` for the observation/operations planes), so
no domain module imports `*_pb2`. The error-kind <-> gRPC code table is `calculet.common.error_codes`
(shared with the client, re-exported here); the client has its own light conversions
(`calculet.client.convert`) and never imports this module. Conventions:
- priority: the wire follows vLLM (lower is served first); the domain queue treats larger as more
  urgent, so the sign flips here;
- an unset seed is drawn here from the OS and returned in SubmitResponse, so a retry or failover
  elsewhere can reuse it;
- `ErrorKind` values on the wire equal gRPC status codes (options documented in common.proto);
- limits that only the wire defines (priority range, id lengths in bytes) are checked here, so the
  domain never sees a request the protocol forbids;
- `check_submit_sizes` is O(1) and runs first, on the event loop; `request_from_pb` is O(tokens), so
  for a large request the servicer runs it on its Submit pool, never on the loop.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from calculet.common.error_codes import ERROR_CLASS as ERROR_CLASS  # re-exported: the table lives there
from calculet.common.error_codes import GRPC_CODE as GRPC_CODE
from calculet.common.error_codes import KIND_OF_CODE as KIND_OF_CODE
from calculet.common.error_codes import RETRY_AFTER_KEY as RETRY_AFTER_KEY
from calculet.common.error_codes import error_from_kind as error_from_kind
from calculet.common.error_codes import kind_from_pb, kind_to_pb
from calculet.common.errors import ErrorKind, InvalidArgument
from calculet.daemon.core.events import (
    Event,
    FinalEvent,
    FinishReason,
    Timings,
    TokenChunk,
    TokenLogprob,
    Usage,
)
from calculet.daemon.core.model_state import ModelState
from calculet.daemon.core.request import MAX_STOP_TOKEN_IDS, NO_TRACE, GenerationRequest, RequestTrace, StoppingParams
from calculet.daemon.core.switch import SwitchSpec
from calculet.daemon.sampling.constraint import Constraint, ConstraintKind
from calculet.daemon.sampling.params import SamplingParams
from calculet.daemon.sampling.thinking import ThinkingBudget
from calculet.v1 import common_pb2, inference_pb2

if TYPE_CHECKING:
    from calculet.daemon.core.events import EventLog
    from calculet.daemon.server.follow import FollowUpdate

# ---- errors --------------------------------------------------------------------------------

PRIORITY_RANGE = (-1000, 1000)  # SubmitRequest.priority
MAX_ID_BYTES = 128  # SubmitRequest.client_request_id and session_id


def error_status(kind: ErrorKind, message: str, retry_after_s: float | None = None) -> common_pb2.ErrorStatus:
    status = common_pb2.ErrorStatus(kind=kind_to_pb(kind), message=message)  # type: ignore[arg-type]
    if retry_after_s is not None:
        status.retry_after_s = retry_after_s
    return status


# ---- enums ---------------------------------------------------------------------------------


def model_state_to_pb(state: ModelState) -> int:
    return int(common_pb2.ModelState.Value(f"MODEL_STATE_{state.name}"))


def model_state_from_pb(value: int) -> ModelState:
    return ModelState[common_pb2.ModelState.Name(value).removeprefix("MODEL_STATE_")]


_FINISH_TO_PB: dict[FinishReason, Any] = {  # values: inference_pb2.FinishReason numbers
    FinishReason.STOP: inference_pb2.FINISH_REASON_STOP,
    FinishReason.LENGTH: inference_pb2.FINISH_REASON_LENGTH,
    FinishReason.CANCELLED: inference_pb2.FINISH_REASON_CANCELLED,
    FinishReason.ERROR: inference_pb2.FINISH_REASON_ERROR,
    FinishReason.DEADLINE: inference_pb2.FINISH_REASON_ERROR,  # with error kind DEADLINE_EXCEEDED
}


def finish_from_pb(value: int, kind: ErrorKind | None) -> FinishReason:
    if value == inference_pb2.FINISH_REASON_ERROR and kind is ErrorKind.DEADLINE_EXCEEDED:
        return FinishReason.DEADLINE
    reasons: dict[int, FinishReason] = {v: k for k, v in _FINISH_TO_PB.items() if k is not FinishReason.DEADLINE}
    return reasons.get(value, FinishReason.ERROR)  # unspecified/unknown: treat as failed


# ---- Submit --------------------------------------------------------------------------------


def sampling_from_pb(pb: inference_pb2.SamplingParams) -> SamplingParams:
    """Raises InvalidArgument for out-of-range fields (SamplingParams checks on construction)."""
    if pb.return_logits:
        raise InvalidArgument("return_logits: raw logits are not served by this daemon yet; use logprobs")
    return SamplingParams(
        seed=pb.seed if pb.HasField("seed") else int.from_bytes(os.urandom(8), "little"),
        temperature=pb.temperature if pb.HasField("temperature") else 1.0,
        top_k=pb.top_k,
        top_p=pb.top_p if pb.HasField("top_p") else 1.0,
        min_p=pb.min_p,
        repetition_penalty=pb.repetition_penalty if pb.HasField("repetition_penalty") else 1.0,
        presence_penalty=pb.presence_penalty,
        frequency_penalty=pb.frequency_penalty,
        logprobs=pb.logprobs if pb.HasField("logprobs") else None,
        constraint=constraint_from_pb(pb.constraint) if pb.HasField("constraint") else None,
        thinking=thinking_from_pb(pb.thinking) if pb.HasField("thinking") else None,
    )


def thinking_from_pb(pb: inference_pb2.ThinkingBudget) -> ThinkingBudget:
    """The domain budget (its range was checked by `server.checks.thinking_range`).

    Raises:
        InvalidArgument: the two ids are equal (an unset pair is 0 and 0).
    """
    return ThinkingBudget(pb.budget, pb.open_token_id, pb.close_token_id)


def thinking_to_pb(t: ThinkingBudget) -> inference_pb2.ThinkingBudget:
    return inference_pb2.ThinkingBudget(budget=t.budget, open_token_id=t.open_token, close_token_id=t.close_token)


def constraint_from_pb(pb: inference_pb2.Constraint) -> Constraint:
    """The domain constraint (sizes were checked by `server.checks.constraint_sizes`).

    Raises:
        InvalidArgument: no field set, json_object false, or an empty schema/regex/grammar/choice.
    """
    which = pb.WhichOneof("kind")
    if which is None:
        raise InvalidArgument("constraint: set one of json_schema, json_object, regex, choice, lark")
    if which == "json_object":
        if not pb.json_object:
            raise InvalidArgument("constraint.json_object: must be true when set")
        return Constraint(ConstraintKind.JSON_OBJECT)
    if which == "choice":
        return Constraint(ConstraintKind.CHOICE, choices=tuple(pb.choice.options))
    return Constraint(ConstraintKind(which), getattr(pb, which))


def constraint_to_pb(c: Constraint) -> inference_pb2.Constraint:
    if c.kind is ConstraintKind.JSON_OBJECT:
        return inference_pb2.Constraint(json_object=True)
    if c.kind is ConstraintKind.CHOICE:
        return inference_pb2.Constraint(choice=inference_pb2.ConstraintChoice(options=list(c.choices)))
    pb = inference_pb2.Constraint()
    setattr(pb, c.kind.value, c.text)  # json_schema, regex or lark: the kind names the oneof field
    return pb


def sampling_to_pb(p: SamplingParams) -> inference_pb2.SamplingParams:
    pb = inference_pb2.SamplingParams(
        seed=p.seed,
        temperature=p.temperature,
        top_k=p.top_k,
        top_p=p.top_p,
        min_p=p.min_p,
        repetition_penalty=p.repetition_penalty,
        presence_penalty=p.presence_penalty,
        frequency_penalty=p.frequency_penalty,
    )
    if p.logprobs is not None:
        pb.logprobs = p.logprobs
    if p.constraint is not None:
        pb.constraint.CopyFrom(constraint_to_pb(p.constraint))
    if p.thinking is not None:
        pb.thinking.CopyFrom(thinking_to_pb(p.thinking))
    return pb


def _check_submit_limits(pb: inference_pb2.SubmitRequest) -> None:
    """Raises InvalidArgument for a field outside the range inference.proto gives it."""
    low, high = PRIORITY_RANGE
    if not low <= pb.priority <= high:
        raise InvalidArgument(f"priority: must be in {low}..{high}, got {pb.priority}")
    for name in ("client_request_id", "session_id"):
        size = len(getattr(pb, name).encode())
        if size > MAX_ID_BYTES:
            raise InvalidArgument(f"{name}: at most {MAX_ID_BYTES} bytes, got {size}")


def check_submit_sizes(pb: inference_pb2.SubmitRequest, context: int) -> None:
    """The O(1) checks of a Submit: token counts, before any token id is read or converted.

    Args:
        pb: the request.
        context: the most prompt + resume tokens it may carry (its model's context; the model's own
            limits are checked again, exactly, by the core).

    Raises:
        InvalidArgument: more prompt + resume tokens than `context`, or more than 64 stop ids.
    """
    tokens = len(pb.prompt_tokens) + len(pb.resume_tokens)
    if tokens > context:
        raise InvalidArgument(f"prompt_tokens + resume_tokens: {tokens} tokens exceed the context of {context}")
    stops = len(pb.stopping.stop_token_ids)
    if stops > MAX_STOP_TOKEN_IDS:
        raise InvalidArgument(f"stop_token_ids: at most {MAX_STOP_TOKEN_IDS} ids, got {stops}")


def request_from_pb(
    pb: inference_pb2.SubmitRequest, default_max_tokens: int, trace: RequestTrace = NO_TRACE
) -> GenerationRequest:
    """Build the domain request; unset max_tokens means `default_max_tokens` (the model's room);
    `trace` comes from the call's metadata (`trace_from_metadata`).

    Raises:
        InvalidArgument: a field outside its wire range (priority, id lengths) or a bad sampling field.
    """
    _check_submit_limits(pb)
    stopping = StoppingParams(
        max_tokens=pb.stopping.max_tokens if pb.stopping.HasField("max_tokens") else default_max_tokens,
        stop_token_ids=tuple(pb.stopping.stop_token_ids),
        ignore_eos=pb.stopping.ignore_eos,
    )
    return GenerationRequest(
        model=pb.model,
        prompt_tokens=tuple(pb.prompt_tokens),
        sampling=sampling_from_pb(pb.sampling),
        stopping=stopping,
        client_request_id=pb.client_request_id,
        resume_tokens=tuple(pb.resume_tokens),
        priority=-pb.priority,
        deadline_s=pb.deadline_ms / 1000.0 if pb.HasField("deadline_ms") else None,
        session_id=pb.session_id,
        trace=trace,
    )


# Submit call metadata (inference.proto, "Submit"): the caller's request id and W3C trace context.
REQUEST_ID_KEY, TRACEPARENT_KEY, TRACESTATE_KEY = "x-request-id", "traceparent", "tracestate"
MAX_TRACESTATE = 512  # W3C: at most 32 list members; longer values are dropped, as the spec allows


def trace_from_metadata(metadata: Any) -> RequestTrace:
    """The caller's request id and trace context from a call's invocation metadata (pairs).

    A malformed traceparent starts a new trace (W3C: ignore it); a tracestate longer than
    `MAX_TRACESTATE` is dropped.

    Raises:
        InvalidArgument: an `x-request-id` longer than `MAX_ID_BYTES` or with characters outside
            printable ASCII (it is written into log lines).
    """
    found = {key: value for key, value in metadata or () if isinstance(value, str)}
    request_id = found.get(REQUEST_ID_KEY, "")
    if len(request_id) > MAX_ID_BYTES or not (request_id.isascii() and request_id.isprintable()):
        raise InvalidArgument(f"x-request-id metadata: at most {MAX_ID_BYTES} printable ASCII characters")
    tracestate = found.get(TRACESTATE_KEY, "")
    return RequestTrace(
        request_id=request_id,
        traceparent=found.get(TRACEPARENT_KEY, "")[:64],  # 55 characters in version 00
        tracestate=tracestate if len(tracestate) <= MAX_TRACESTATE else "",
    )


def request_to_pb(req: GenerationRequest) -> inference_pb2.SubmitRequest:
    pb = inference_pb2.SubmitRequest(
        model=req.model,
        client_request_id=req.client_request_id,
        prompt_tokens=list(req.prompt_tokens),
        resume_tokens=list(req.resume_tokens),
        sampling=sampling_to_pb(req.sampling),
        stopping=inference_pb2.StoppingParams(
            max_tokens=req.stopping.max_tokens,
            stop_token_ids=list(req.stopping.stop_token_ids),
            ignore_eos=req.stopping.ignore_eos,
        ),
        priority=-req.priority,
        session_id=req.session_id,
    )
    if req.deadline_s is not None:
        pb.deadline_ms = max(1, round(req.deadline_s * 1000))
    return pb


# ---- Wait events ---------------------------------------------------------------------------


def event_to_pb(
    event: Event, generation: int = 0, recoveries: int = 0, stop_token_id: int | None = None
) -> inference_pb2.WaitEvent:
    """A Wait event; for a Final, `generation`, `recoveries` and (reason STOP) the stop token."""
    if isinstance(event, TokenChunk):
        chunk = inference_pb2.TokenChunk(
            first_index=event.first_index,
            tokens=list(event.tokens),
            logprobs=[
                inference_pb2.TokenLogprob(
                    token=lp.token,
                    logprob=lp.logprob,
                    top=[inference_pb2.TopLogprob(token=t, logprob=v) for t, v in lp.top],
                )
                for lp in event.logprobs
            ],
        )
        return inference_pb2.WaitEvent(index=event.index, tokens=chunk)
    final = inference_pb2.Final(
        finish_reason=_FINISH_TO_PB[event.reason],
        usage=inference_pb2.Usage(
            prompt_tokens=event.usage.prompt_tokens,
            completion_tokens=event.usage.completion_tokens,
            resumed_tokens=event.usage.resumed_tokens,
            cached_tokens=event.usage.cached_tokens,
        ),
        timings=inference_pb2.Timings(
            queue_s=event.timings.queue,
            prefill_s=event.timings.prefill,
            ttft_s=event.timings.ttft,
            decode_s=event.timings.decode,
            e2e_s=event.timings.e2e,
        ),
        generation=generation,
        recoveries=recoveries,
    )
    if event.error_kind is not None:
        final.error.CopyFrom(error_status(event.error_kind, event.error_message, event.retry_after_s))
    if stop_token_id is not None:
        final.stop_token_id = stop_token_id
    return inference_pb2.WaitEvent(index=event.index, final=final)


# (generation, recoveries, stop token) of a finished job, for its Final (`event_to_pb`).
FinalExtras = Callable[[str, "EventLog", FinalEvent], tuple[int, int, int | None]]


def follow_reply_to_pb(updates: list[FollowUpdate], final_extras: FinalExtras) -> inference_pb2.FollowReply:
    """One Follow reply. Token chunks without logprobs (a decode step's usual event) are filled in
    place, without building a WaitEvent to copy; everything else goes through `event_to_pb`."""
    reply = inference_pb2.FollowReply()
    for update in updates:
        item = reply.updates.add(follow_id=update.follow_id)
        if update.error is not None:
            err = update.error
            item.error.CopyFrom(error_status(err.kind, str(err), getattr(err, "retry_after_s", None)))
            continue
        for event in update.events:
            if isinstance(event, TokenChunk) and not event.logprobs:
                pb = item.events.add(index=event.index)
                pb.tokens.first_index = event.first_index
                pb.tokens.tokens.extend(event.tokens)
            elif isinstance(event, FinalEvent):
                assert update.log is not None  # only refusals have no log, and they have no events
                generation, recoveries, stop = final_extras(update.job_id, update.log, event)
                item.events.append(event_to_pb(event, generation, recoveries, stop))
            else:
                item.events.append(event_to_pb(event))
    return reply


def event_from_pb(pb: inference_pb2.WaitEvent) -> Event:
    if pb.HasField("tokens"):
        t = pb.tokens
        logprobs = tuple(
            TokenLogprob(lp.token, lp.logprob, tuple((x.token, x.logprob) for x in lp.top)) for lp in t.logprobs
        )
        return TokenChunk(pb.index, t.first_index, tuple(t.tokens), logprobs)
    f = pb.final
    kind = kind_from_pb(f.error.kind) if f.HasField("error") and f.error.kind else None
    return FinalEvent(
        index=pb.index,
        reason=finish_from_pb(f.finish_reason, kind),
        usage=Usage(f.usage.prompt_tokens, f.usage.completion_tokens, f.usage.resumed_tokens, f.usage.cached_tokens),
        timings=Timings(f.timings.queue_s, f.timings.prefill_s, f.timings.ttft_s, f.timings.decode_s, f.timings.e2e_s),
        error_kind=kind,
        error_message=f.error.message if f.HasField("error") else "",
        retry_after_s=f.error.retry_after_s if f.HasField("error") and f.error.HasField("retry_after_s") else None,
    )


def switch_from_pb(options: Any) -> SwitchSpec | None:
    """A LoadOptions' switch (switch_from, force, reason, requester); None when switch_from is unset.

    Raises:
        InvalidArgument: a reason or requester over 256 characters, or force/reason/requester given
            without switch_from.
    """
    if not options.HasField("switch_from"):
        if options.force or options.reason or options.requester:
            raise InvalidArgument("options.force, reason and requester apply to a switch: set options.switch_from")
        return None
    target = options.switch_from
    return SwitchSpec(target.alias, target.generation, options.force, options.reason, options.requester)
