"""Request messages the clients send and the small results they return, built in one place.

Owns the client-side argument checks that protobuf itself would turn into untyped ValueErrors
(negative or oversized integers, wrong types, unknown enum names, both fault triggers) and raises
`InvalidArgument` for them, naming the field; everything the daemon can judge better (vocab,
context, sampling ranges, the ranges the protocol documents) is left to the daemon. Data flow:
client method arguments -> these builders (client types through `calculet.client.convert`) ->
protobuf request. No daemon domain type is involved.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from calculet.client.convert import error_from_status, sampling_to_pb
from calculet.client.types import UINT32_MAX, UINT64_MAX, SamplingParams, check_integer
from calculet.common.errors import CalculetError, ErrorKind, InvalidArgument
from calculet.v1 import common_pb2, inference_pb2, observe_pb2, operate_pb2

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
# The protocol's longest drain window (operate.proto); calls that may wait that long get it
# added to the client's deadline when the caller leaves the window to the daemon's default.
MAX_DRAIN_WINDOW_S = 3600.0


@dataclass(frozen=True)
class SubmitResult:
    """Submit's answer.

    Attributes:
        job_id: the daemon's id for the job (needed for Wait and Cancel).
        deduplicated: the client_request_id matched a job the daemon already had.
        seed: the seed the job samples with (resend it when resuming elsewhere).
        generation: model generation the job was admitted on.
    """

    job_id: str
    deduplicated: bool
    seed: int
    generation: int

    @classmethod
    def from_pb(cls, pb: inference_pb2.SubmitResponse) -> SubmitResult:
        return cls(pb.job_id, pb.deduplicated, pb.seed, pb.generation)


def sampling_params(
    sampling: SamplingParams | None,
    *,
    temperature: float | None,
    top_p: float | None,
    top_k: int | None,
    seed: int | None,
    logprobs: int | None,
) -> SamplingParams:
    """The sampling of a request: `sampling` itself, or one built from the individual fields.

    Raises:
        InvalidArgument: both `sampling` and an individual field given, or a field protobuf
            cannot carry (see `SamplingParams`).
    """
    individual = {"temperature": temperature, "top_p": top_p, "top_k": top_k, "seed": seed, "logprobs": logprobs}
    if sampling is not None:
        given = sorted(name for name, value in individual.items() if value is not None)
        if given:
            raise InvalidArgument(f"sampling: give either `sampling` or {', '.join(given)}, not both")
        if not isinstance(sampling, SamplingParams):
            raise InvalidArgument(f"sampling: must be a calculet.client.SamplingParams, got {type(sampling).__name__}")
        return sampling
    return SamplingParams(
        seed=seed, temperature=temperature, top_k=0 if top_k is None else top_k, top_p=top_p, logprobs=logprobs
    )


def submit_request(
    model: str,
    prompt_tokens: Sequence[int],
    *,
    max_tokens: int | None,
    temperature: float | None,
    top_p: float | None,
    top_k: int | None,
    seed: int | None,
    stop_token_ids: Sequence[int],
    ignore_eos: bool,
    logprobs: int | None,
    priority: int,
    client_request_id: str,
    resume_tokens: Sequence[int],
    sampling: SamplingParams | None,
    deadline_s: float | None,
    session_id: str,
) -> inference_pb2.SubmitRequest:
    """The Submit message for `submit` / `generate` (arguments as documented on `DaemonClient.generate`).

    Unset (None) sampling fields, seed and max_tokens stay unset on the wire: the daemon applies its
    defaults, picks the seed (returned in SubmitResponse.seed) and, without max_tokens, runs until
    EOS or a full context. `priority` follows the wire convention (lower is served first).

    Raises:
        InvalidArgument: both `sampling` and individual sampling fields given, or a field protobuf
            cannot carry (token id or max_tokens outside uint32, priority outside int32, seed
            outside uint64, a deadline that is not a positive finite number of seconds, a
            non-string id, a non-bool ignore_eos).
    """
    params = sampling_params(sampling, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed, logprobs=logprobs)
    for name, value in (("model", model), ("client_request_id", client_request_id), ("session_id", session_id)):
        if not isinstance(value, str):
            raise InvalidArgument(f"{name}: must be a string, got {value!r}")
    if not isinstance(ignore_eos, bool):
        raise InvalidArgument(f"ignore_eos: must be a bool, got {ignore_eos!r}")
    pb = inference_pb2.SubmitRequest(
        model=model,
        client_request_id=client_request_id,
        prompt_tokens=_token_ids("prompt_tokens", prompt_tokens),
        resume_tokens=_token_ids("resume_tokens", resume_tokens),
        sampling=sampling_to_pb(params),
        stopping=inference_pb2.StoppingParams(
            stop_token_ids=_token_ids("stop_token_ids", stop_token_ids), ignore_eos=ignore_eos
        ),
        priority=check_integer("priority", priority, INT32_MIN, INT32_MAX),
        session_id=session_id,
    )
    if max_tokens is not None:
        pb.stopping.max_tokens = check_integer("max_tokens", max_tokens, 0, UINT32_MAX)
    if deadline_s is not None:
        pb.deadline_ms = _deadline_ms(deadline_s)
    return pb


def _deadline_ms(d: object) -> int:
    if isinstance(d, bool) or not isinstance(d, int | float) or not math.isfinite(d) or d <= 0:
        raise InvalidArgument(f"deadline_s: must be a positive number of seconds, got {d!r}")
    if d * 1000 > UINT32_MAX:
        raise InvalidArgument(f"deadline_s: at most {UINT32_MAX // 1000} seconds, got {d}")
    return max(1, round(d * 1000))


def wait_request(job_id: str, from_index: int) -> inference_pb2.WaitRequest:
    """Raises: InvalidArgument: from_index not an integer in uint64 range."""
    return inference_pb2.WaitRequest(
        job_id=job_id, from_event_index=check_integer("from_index", from_index, 0, UINT64_MAX)
    )


def watch_load_request(interval_ms: int) -> observe_pb2.WatchLoadRequest:
    """Raises: InvalidArgument: interval_ms not a uint32 (the daemon checks its range)."""
    return observe_pb2.WatchLoadRequest(interval_ms=check_integer("interval_ms", interval_ms, 0, UINT32_MAX))


@dataclass(frozen=True)
class Switch:
    """A Load that replaces exactly `alias` at `generation` (compare-and-swap; operate.proto).

    Attributes:
        force: switch even within the daemon's minimum residency.
        reason / requester: why and who asked, for the board's audit trail.
    """

    alias: str
    generation: int
    force: bool = False
    reason: str = ""
    requester: str = ""


def load_request(
    alias: str,
    package: str,
    *,
    replace: bool,
    drain_timeout_ms: int | None,
    lanes: int | None,
    switch: Switch | None = None,
) -> operate_pb2.LoadRequest:
    """Raises: InvalidArgument: drain_timeout_ms, lanes or the switch's generation out of range."""
    options = operate_pb2.LoadOptions(replace=replace)
    if drain_timeout_ms is not None:
        options.drain_timeout_ms = check_integer("drain_timeout_ms", drain_timeout_ms, 0, UINT32_MAX)
    if lanes is not None:
        options.lanes = check_integer("lanes", lanes, 0, UINT32_MAX)
    if switch is not None:
        generation = check_integer("switch.generation", switch.generation, 0, 2**64 - 1)
        options.switch_from.CopyFrom(operate_pb2.SwitchFrom(alias=switch.alias, generation=generation))
        options.force, options.reason, options.requester = switch.force, switch.reason, switch.requester
    return operate_pb2.LoadRequest(alias=alias, package=package, options=options)


def unload_request(alias: str, drain_timeout_ms: int | None) -> operate_pb2.UnloadRequest:
    """Raises: InvalidArgument: drain_timeout_ms not a uint32."""
    pb = operate_pb2.UnloadRequest(alias=alias)
    if drain_timeout_ms is not None:
        pb.drain_timeout_ms = check_integer("drain_timeout_ms", drain_timeout_ms, 0, UINT32_MAX)
    return pb


def drain_request(timeout_ms: int | None, interrupt_remaining: bool) -> operate_pb2.DrainRequest:
    """Raises: InvalidArgument: timeout_ms not a uint32."""
    pb = operate_pb2.DrainRequest(interrupt_remaining=interrupt_remaining)
    if timeout_ms is not None:
        pb.timeout_ms = check_integer("timeout_ms", timeout_ms, 0, UINT32_MAX)
    return pb


def reset_request(kind: str, reason: str, model: str) -> operate_pb2.ResetRequest:
    """`kind` is "ccu", "configuration" or "device" (case-insensitive).

    Raises:
        InvalidArgument: unknown kind.
    """
    value = _enum_by_name("kind", common_pb2.ResetKind, "RESET_KIND_", kind)
    return operate_pb2.ResetRequest(kind=value, reason=reason, model=model)  # type: ignore[arg-type]


def inject_fault_request(
    kind: str | None,
    *,
    job_index: int | None,
    probability: float | None,
    seed: int,
    delay_ms: int,
    clear_existing: bool,
) -> operate_pb2.InjectFaultRequest:
    """`kind` is a FaultKind name such as "ccu_exception" or "slow_job"; None plans nothing.

    Raises:
        InvalidArgument: unknown kind; both job_index and probability (neither means the next
            device submit attempt); a trigger without a kind; integers protobuf cannot carry.
    """
    pb = operate_pb2.InjectFaultRequest(clear_existing=clear_existing)
    if kind is None:
        if job_index is not None or probability is not None:
            raise InvalidArgument("kind: a fault trigger was given without a fault kind")
        return pb
    if job_index is not None and probability is not None:
        raise InvalidArgument("trigger: give at most one of job_index and probability")
    fault = operate_pb2.FaultSpec(
        kind=_enum_by_name("kind", operate_pb2.FaultKind, "FAULT_KIND_", kind),  # type: ignore[arg-type]
        seed=check_integer("seed", seed, 0, UINT64_MAX),
        delay_ms=check_integer("delay_ms", delay_ms, 0, UINT32_MAX),
    )
    if job_index is not None:
        fault.job_index = check_integer("job_index", job_index, 0, UINT64_MAX)
    elif probability is not None:
        if isinstance(probability, bool) or not isinstance(probability, int | float):
            raise InvalidArgument(f"probability: must be a number, got {probability!r}")
        fault.probability = float(probability)
    pb.fault.CopyFrom(fault)
    return pb


def load_outcome(last: operate_pb2.LoadProgress | None, alias: str) -> operate_pb2.LoadProgress:
    """The final progress of a Load stream, or its typed error.

    Args:
        last: the last message received (None if the stream sent none).
        alias: for the message.

    Raises:
        CalculetError: the load FAILED (the typed error of its ErrorStatus, e.g.
            FailedPrecondition for an invalid package), or INTERNAL when the stream ended
            without its `done` message.
    """
    if last is None or not last.done:
        raise CalculetError(f"Load stream of {alias!r} ended before its last progress", kind=ErrorKind.INTERNAL)
    if last.state == common_pb2.MODEL_STATE_FAILED or last.HasField("error"):
        raise error_from_status(last.error)
    return last


def operation_timeout(base_s: float, window_ms: int | None) -> float:
    """Client deadline for a call that may wait a drain window: `base_s` plus the window."""
    window_s = MAX_DRAIN_WINDOW_S if window_ms is None else window_ms / 1000.0
    return base_s + window_s


def _token_ids(name: str, ids: Sequence[int]) -> list[int]:
    return [check_integer(f"{name}[{i}]", tok, 0, UINT32_MAX) for i, tok in enumerate(ids)]


def _enum_by_name(field: str, enum: object, prefix: str, name: str) -> int:
    """Value of `prefix + NAME` in a generated enum wrapper (`-` and case are forgiven)."""
    values: dict[str, int] = {
        key.removeprefix(prefix).lower(): int(value)
        for key, value in enum.items()  # type: ignore[attr-defined]
        if not key.endswith("_UNSPECIFIED")
    }
    key = name.lower().replace("-", "_") if isinstance(name, str) else ""
    if key not in values:
        raise InvalidArgument(f"{field}: {name!r} is not one of {', '.join(sorted(values))}")
    return values[key]
