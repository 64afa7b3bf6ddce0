"""Request checks that only the wire protocol defines, made before any `DeviceCore` call.

The core validates what it owns (prompts against the model, sampling, package contents); the
ranges written in `protos/calculet/v1/` comments for transport-level fields live here: drain
windows, WatchLoad intervals, Reset kind/reason/model, package paths no filesystem can hold, job ids
longer than any the daemon hands out. Each refusal is a typed `CalculetError`
that `server.errors.map_errors` turns into the status the proto documents. Also the stop token a
STOP Final names, read from the job's event log, and the size of the largest valid request (what
the gRPC receive limit is derived from).
"""

from __future__ import annotations

from collections.abc import Callable

from calculet.common.errors import InvalidArgument, NotFound
from calculet.daemon.core.events import EventLog, TokenChunk
from calculet.daemon.sampling.constraint import MAX_CHOICES, MAX_GRAMMAR_BYTES, check_sizes
from calculet.daemon.sampling.thinking import MAX_THINKING_BUDGET
from calculet.v1 import common_pb2, inference_pb2, operate_pb2

MAX_WINDOW_MS = 3_600_000  # longest drain window operate.proto allows
WATCH_INTERVAL_MS = (50, 60_000)  # WatchLoadRequest.interval_ms range; 0 = the default below
DEFAULT_WATCH_INTERVAL_MS = 1000
MAX_RESET_REASON_BYTES = 256
MAX_PATH_BYTES = 4095  # PATH_MAX without the NUL
MAX_NAME_BYTES = 255  # NAME_MAX: one path component
RESET_KINDS = {common_pb2.RESET_KIND_CCU: "ccu", common_pb2.RESET_KIND_CONFIGURATION: "configuration"}
MAX_JOB_ID_CHARS = 64  # inference.proto SubmitResponse.job_id: at most 64 ASCII characters

# The receive limit is sized for this context unless a larger model is loaded: the calbin context
# of CalRT 0.7.6 packages (docs/sources.md 001 §5, docs/vendor-binding.md).
REFERENCE_CONTEXT = 40_960
TOKEN_ID_BYTES = 5  # a uint32 token id as a protobuf varint, at most
# Every SubmitRequest field but the token lists and the constraint, each at its wire limit, is about
# 1 KiB (alias, client_request_id and session_id at 128 bytes, 64 stop ids, sampling, priority,
# deadline); the largest other request, a LoadRequest with a 4,095-byte package path, about 4.3 KiB.
# Rounded up to 8 KiB, so the limit covers every request type whatever the context (the unit test
# builds them). A constraint adds its text (at most MAX_GRAMMAR_BYTES) and its framing: a tag and a
# length of up to 3 bytes per choice, plus the messages around them.
CONSTRAINT_BYTES = MAX_GRAMMAR_BYTES + 4 * MAX_CHOICES + 16
REQUEST_FIELDS_BYTES = 8192 + CONSTRAINT_BYTES


def request_bytes(context: int) -> int:
    """The size of the largest valid request to a model of `context` tokens: prompt + resume ids (at
    most `context` of them, 5 bytes each) plus every other field at its limit."""
    return context * TOKEN_ID_BYTES + REQUEST_FIELDS_BYTES


def constraint_sizes(sampling: inference_pb2.SamplingParams) -> None:
    """A Submit's constraint within its size bounds (inference.proto Constraint), checked before it
    is converted or compiled.

    Raises:
        InvalidArgument: more than MAX_GRAMMAR_BYTES of text or MAX_CHOICES choices; names the field.
    """
    if not sampling.HasField("constraint"):
        return
    c = sampling.constraint
    which = c.WhichOneof("kind")
    if which == "choice":
        check_sizes("choice", "", c.choice.options)
    elif which in ("json_schema", "regex", "lark"):
        check_sizes(which, getattr(c, which), ())


def thinking_range(sampling: inference_pb2.SamplingParams) -> None:
    """A Submit's thinking budget within the range inference.proto ThinkingBudget gives it (a uint32
    on the wire), checked before it is converted; the ids are judged against the model by the core.

    Raises:
        InvalidArgument: budget above MAX_THINKING_BUDGET; names the field.
    """
    if sampling.HasField("thinking") and sampling.thinking.budget > MAX_THINKING_BUDGET:
        raise InvalidArgument(f"thinking.budget: must be at most {MAX_THINKING_BUDGET}, got {sampling.thinking.budget}")


def job_id(value: str) -> str:
    """A WaitRequest/CancelRequest job id that could name a job (checked before any lookup, so a huge
    one is neither hashed under the engine lock nor echoed).

    Raises:
        NotFound: longer than any job id the daemon hands out.
    """
    if len(value) > MAX_JOB_ID_CHARS:
        raise NotFound(f"unknown job id ({len(value)} characters; job ids have at most {MAX_JOB_ID_CHARS})")
    return value


def drain_window_s(name: str, value: int, present: bool) -> float | None:
    """An optional drain window in ms, in seconds (None = unset: the daemon's default).

    Raises:
        InvalidArgument: more than an hour.
    """
    if not present:
        return None
    if value > MAX_WINDOW_MS:
        raise InvalidArgument(f"{name}: at most {MAX_WINDOW_MS} ms, got {value}")
    return value / 1000.0


def package_path(path: str) -> str:
    """A LoadRequest.package that a filesystem call can take (the core confines it to the root).

    Raises:
        InvalidArgument: a NUL byte, more than 4095 bytes, or a component of more than 255 bytes
            (the OS would refuse it with an error that is not the caller's kind of mistake).
    """
    raw = path.encode()
    if b"\x00" in raw:
        raise InvalidArgument("package: must not contain a NUL byte")
    if len(raw) > MAX_PATH_BYTES:
        raise InvalidArgument(f"package: at most {MAX_PATH_BYTES} bytes, got {len(raw)}")
    longest = max((len(part) for part in raw.split(b"/")), default=0)
    if longest > MAX_NAME_BYTES:
        raise InvalidArgument(f"package: a path component is {longest} bytes (at most {MAX_NAME_BYTES})")
    return path


def watch_interval_s(interval_ms: int) -> float:
    """WatchLoadRequest.interval_ms in seconds (0 = the default).

    Raises:
        InvalidArgument: not 0 and outside 50..60000.
    """
    low, high = WATCH_INTERVAL_MS
    if interval_ms and not low <= interval_ms <= high:
        raise InvalidArgument(f"interval_ms: 0 (default) or {low}..{high}, got {interval_ms}")
    return (interval_ms or DEFAULT_WATCH_INTERVAL_MS) / 1000.0


def reset_kind(request: operate_pb2.ResetRequest, is_model: Callable[[str], bool]) -> str:
    """The core's name ("ccu" or "configuration") of a valid ResetRequest.

    Args:
        request: the request.
        is_model: whether an alias is loaded.

    Raises:
        InvalidArgument: kind unset or DEVICE, reason not 1..256 bytes, a model named with a kind
            other than CONFIGURATION.
        NotFound: the named model is not loaded.
    """
    kind = RESET_KINDS.get(request.kind)
    if kind is None:
        raise InvalidArgument("reset kind: must be CCU or CONFIGURATION (device resets need a process restart)")
    if not 1 <= len(request.reason.encode()) <= MAX_RESET_REASON_BYTES:
        raise InvalidArgument(f"reason: 1..{MAX_RESET_REASON_BYTES} bytes for the audit log")
    if request.model and kind != "configuration":
        raise InvalidArgument("model: only a CONFIGURATION reset names a model")
    if request.model and not is_model(request.model):
        raise NotFound(f"unknown model {request.model!r}")
    return kind


def stop_token(log: EventLog) -> int | None:
    """The token that ended a STOP job: the last token it streamed (inference.proto Final)."""
    for event in reversed(log.read(0)):
        if isinstance(event, TokenChunk) and event.tokens:
            return event.tokens[-1]
    return None


def wait_start(log: EventLog, job: str, from_index: int) -> int:
    """A Wait's (or a Follow attachment's) first event index, checked against what the job produced.

    Raises:
        InvalidArgument: beyond the events produced so far.
    """
    produced = log.produced()
    if from_index > produced:
        raise InvalidArgument(f"from_event_index: {from_index} is beyond the {produced} events job {job} has produced")
    return from_index
