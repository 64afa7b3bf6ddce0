"""What a caller asks the daemon to generate, and the checks it must pass before admission.

`GenerationRequest` is the domain form of a `Submit` (the wire module converts protobuf to it).
`validate_request` checks it against the serving model's limits and raises `InvalidArgument`
with a message naming the field; nothing is queued or reserved for a request that fails here.

Cost: the O(1) length checks come first, so an oversized prompt is refused before any id is read;
the id checks are vectorised (numpy), O(tokens). The transport runs `prevalidate` outside the engine
lock (and, for a large request, off the event loop) and hands the engine a `CheckedRequest`: the
request and the limits it passed. Validation is a pure function of (request, limits), so the engine
checks such a request again only when the serving limits differ (another generation took the alias).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from calculet.common.errors import InvalidArgument
from calculet.daemon.sampling.params import SamplingParams

MAX_STOP_TOKEN_IDS = 64
MAX_CLIENT_REQUEST_ID = 128


@dataclass(frozen=True)
class StoppingParams:
    """When generation ends. `max_tokens` counts every completion token, resumed ones included."""

    max_tokens: int
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False


@dataclass(frozen=True)
class RequestTrace:
    """Who asked, for logs and traces; not part of the request's identity (a retry may differ).

    Attributes:
        request_id: the caller's request id (gRPC metadata `x-request-id`; the gateway's
            `x-request-id`), logged with the job; "" = none.
        traceparent / tracestate: W3C trace context of the caller's span, carried opaque (the
            telemetry package parses it); "" = none.
    """

    request_id: str = ""
    traceparent: str = ""
    tracestate: str = ""


NO_TRACE = RequestTrace()


@dataclass(frozen=True)
class GenerationRequest:
    """One generation job.

    Attributes:
        model: model alias.
        prompt_tokens: prompt token ids (non-empty).
        sampling / stopping: how to draw tokens and when to stop.
        client_request_id: idempotency key; a second Submit with the same key returns the first job.
        resume_tokens: completion tokens an earlier attempt already produced (failover/retry); the
            daemon re-prefills them and continues, so the output equals an undisturbed run.
        priority: higher runs first among waiting requests.
        deadline_s: seconds from submit after which a still-queued request is refused (None = none).
        session_id: routing hint for prefix reuse; carried, not interpreted by the daemon.
        trace: the caller's request id and trace context (logs and spans only).
    """

    model: str
    prompt_tokens: tuple[int, ...]
    sampling: SamplingParams
    stopping: StoppingParams
    client_request_id: str = ""
    resume_tokens: tuple[int, ...] = ()
    priority: int = 0
    deadline_s: float | None = None
    session_id: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    trace: RequestTrace = NO_TRACE


@dataclass(frozen=True)
class ModelLimits:
    """The serving model's limits that requests are checked against."""

    vocab_size: int
    context: int  # tokens a sequence may hold (prompt + completion)
    prefill_tokens: int  # largest prefill bucket
    eos_token_ids: frozenset[int] = frozenset()


def validate_request(req: GenerationRequest, limits: ModelLimits) -> None:
    """Raise `InvalidArgument` naming the first offending field; return when the request is servable.

    Lengths first (O(1)), then token ids (vectorised, O(tokens)), then sampling.
    """
    _check_sizes(req, limits)
    _check_ids("prompt_tokens", req.prompt_tokens, limits.vocab_size)
    resume = _check_ids("resume_tokens", req.resume_tokens, limits.vocab_size)
    _check_ids("stop_token_ids", req.stopping.stop_token_ids, limits.vocab_size)
    _check_resume_not_stopped(req, resume, limits)
    _check_thinking_not_stopped(req, limits)
    if req.deadline_s is not None and (math.isnan(req.deadline_s) or req.deadline_s <= 0):
        raise InvalidArgument(f"deadline: must be positive, got {req.deadline_s}")
    req.sampling.validate(limits.vocab_size)


@dataclass(frozen=True)
class CheckedRequest:
    """A request that passed `validate_request` against `limits`. Made only by `prevalidate`.

    Attributes:
        request: the request.
        limits: the limits it passed.
    """

    request: GenerationRequest
    limits: ModelLimits


def prevalidate(req: GenerationRequest, limits: ModelLimits) -> CheckedRequest:
    """`validate_request`, for a caller outside the engine lock.

    Returns:
        The request with the limits it passed, so the engine's check costs nothing while they serve.
    Raises:
        InvalidArgument: as `validate_request`.
    """
    validate_request(req, limits)
    return CheckedRequest(req, limits)


def servable(req: GenerationRequest | CheckedRequest, limits: ModelLimits) -> GenerationRequest:
    """The request, checked against the serving `limits`: at once for a `CheckedRequest` that passed
    equal ones, else by `validate_request`.

    Raises:
        InvalidArgument: as `validate_request`.
    """
    if isinstance(req, CheckedRequest):
        if req.limits == limits:
            return req.request
        req = req.request
    validate_request(req, limits)
    return req


def _check_sizes(req: GenerationRequest, limits: ModelLimits) -> None:
    """The O(1) checks: every count and length, before any token id is read."""
    if not req.prompt_tokens:
        raise InvalidArgument("prompt_tokens: must not be empty")
    if len(req.stopping.stop_token_ids) > MAX_STOP_TOKEN_IDS:
        raise InvalidArgument(f"stop_token_ids: at most {MAX_STOP_TOKEN_IDS} ids")
    if len(req.client_request_id) > MAX_CLIENT_REQUEST_ID:
        raise InvalidArgument(f"client_request_id: at most {MAX_CLIENT_REQUEST_ID} characters")
    max_tokens = req.stopping.max_tokens
    if max_tokens < 1:
        raise InvalidArgument(f"max_tokens: must be at least 1, got {max_tokens}")
    if max_tokens > limits.context:
        raise InvalidArgument(f"max_tokens: {max_tokens} exceeds the model context of {limits.context} tokens")
    if len(req.resume_tokens) >= max_tokens:
        raise InvalidArgument(
            f"resume_tokens: {len(req.resume_tokens)} already generated leaves nothing of max_tokens={max_tokens}"
        )
    prefill_len = len(req.prompt_tokens) + len(req.resume_tokens)
    if prefill_len > limits.prefill_tokens:
        raise InvalidArgument(
            f"prompt_tokens: {prefill_len} tokens (with resumed ones) exceed the prefill limit of "
            f"{limits.prefill_tokens}"
        )
    if len(req.prompt_tokens) + max_tokens > limits.context:
        raise InvalidArgument(
            f"prompt_tokens + max_tokens: {len(req.prompt_tokens)} + {max_tokens} exceeds the model context "
            f"of {limits.context} tokens"
        )


def _check_ids(name: str, ids: Sequence[int], vocab_size: int) -> np.ndarray:
    """Every id in [0, vocab_size), checked in one vectorised pass. Returns the ids as int64.

    Raises:
        InvalidArgument: naming the first id outside the vocabulary.
    """
    try:
        arr = np.fromiter(ids, dtype=np.int64, count=len(ids))
    except OverflowError:  # beyond int64: outside any vocabulary (the wire carries uint32 only)
        raise InvalidArgument(f"{name}: a token id is outside the vocabulary [0, {vocab_size})") from None
    bad = np.flatnonzero((arr < 0) | (arr >= vocab_size))
    if bad.size:
        i = int(bad[0])
        raise InvalidArgument(f"{name}[{i}]: token id {ids[i]} outside the vocabulary [0, {vocab_size})")
    return arr


def _check_resume_not_stopped(req: GenerationRequest, resume: np.ndarray, limits: ModelLimits) -> None:
    """No resumed token may be a stop token: the earlier attempt would have finished at it."""
    stops = set(req.stopping.stop_token_ids) | (set() if req.stopping.ignore_eos else set(limits.eos_token_ids))
    if not stops or not resume.size:
        return
    hits = np.flatnonzero(np.isin(resume, np.fromiter(stops, dtype=np.int64, count=len(stops))))
    if hits.size:
        i = int(hits[0])
        raise InvalidArgument(
            f"resume_tokens[{i}]: {int(resume[i])} is a stop token, so the earlier attempt had already finished"
        )


def _check_thinking_not_stopped(req: GenerationRequest, limits: ModelLimits) -> None:
    """Neither think marker may be a stop token: a forced close would end the job instead of letting
    it answer (docs/daemon.md "Thinking budget")."""
    thinking = req.sampling.thinking
    if thinking is None:
        return
    stops = set(req.stopping.stop_token_ids) | (set() if req.stopping.ignore_eos else set(limits.eos_token_ids))
    for name, token in (("open_token_id", thinking.open_token), ("close_token_id", thinking.close_token)):
        if token in stops:
            raise InvalidArgument(f"thinking.{name}: {token} is a stop token of this request")
