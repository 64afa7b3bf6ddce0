"""Engine events for telemetry: the `EngineObserver` interface and the `ObserverHub` that delivers
them (docs/metrics.md; metrics in `calculet.daemon.telemetry`, traces later).

Data flow: the engine builds a small frozen event where something happens (a request queued, a
device job started or done, a request finished, a refusal, a reset, a fault) and hands it to its
`ObserverHub` with `emit`, which only puts it on a queue (no other work, so emitting under the engine
lock costs a queue put and never waits). The hub's own thread delivers the events, in emit order, to
each observer's method for that event type. So an observer never runs on an engine thread and never
under the engine lock: a slow exporter cannot delay the device. With no observer added, the engine
builds no event at all (`ObserverHub.active`), and no event of a type no observer overrides
(`ObserverHub.wants`).

A request's timeline from its events (monotonic seconds, `time.monotonic`):

    RequestQueued.t                       Submit accepted, waiting for a KV lane
    first DeviceJobStarted naming it      its lane was given and its prefill submitted (admission)
    DeviceJobDone rows naming it          each prefill/decode job that carried it, with the device's
                                          own phase timestamps; `RowDone.first` marks its first token
    RequestFinished.t                     its Final, with usage and the timings it reports

Events carry their own times, so delivery latency never changes a measured value. Only the engine
imports this module's events to build them; observers read them; nothing here imports OpenTelemetry.
"""

from __future__ import annotations

import logging
import threading
from abc import ABC
from collections.abc import Callable
from dataclasses import dataclass
from queue import SimpleQueue
from typing import Any

from calculet.common.errors import ErrorKind
from calculet.daemon.core.audit import AuditEntry
from calculet.daemon.core.events import FinishReason, Timings, Usage
from calculet.daemon.core.request import NO_TRACE, RequestTrace
from calculet.daemon.device.types import EngineSlot, JobStatus, JobTimestamps, TaskType

log = logging.getLogger(__name__)

# Fault kinds (`FaultSeen.kind`, `DeviceJobDone.faults`).
FAULT_CCU_EXCEPTION = "ccu_exception"  # a device job ended with a CCU exception nobody asked for
FAULT_NON_FINITE = "non_finite_logits"  # NaN/Inf logits in a row
FAULT_COUNTER_MISMATCH = "counter_mismatch"  # the device's job counters disagree with the executor
FAULT_HANG = "hang"  # a device job did not finish within the job timeout
FAULT_UNLOAD_LEAK = "unload_leak"  # an unload did not give back the memory its configure took
FAULT_DEVICE_LOST = "device_lost"  # the board stopped serving (device lost, reset budget used up, crash)


@dataclass(frozen=True, slots=True)
class RequestQueued:
    """A Submit was accepted and queued (not a deduplicated retry).

    Attributes:
        internal: a warm-up probe (golden check), not a client request.
        t: monotonic time of the Submit (`ClientJob.t_submit`).
        trace: the caller's request id and W3C trace context (logs and spans).
    """

    job_id: str
    model: str
    generation: int
    prompt_tokens: int
    resumed_tokens: int
    client_request_id: str
    internal: bool
    t: float
    trace: RequestTrace = NO_TRACE


@dataclass(frozen=True, slots=True)
class RequestRejected:
    """A Submit refused by admission: `reason` is "queue_full", "admission_timeout", "deadline", or the
    error kind of a model or board that cannot take it ("unavailable", "not_found")."""

    model: str
    reason: str
    t: float


@dataclass(frozen=True, slots=True)
class DeviceJobStarted:
    """The device accepted a device job (host monotonic `t`); `job_ids` are its rows' requests."""

    device_job_id: int
    task: TaskType
    bank: EngineSlot
    model: str
    generation: int
    job_ids: tuple[str, ...]
    t: float


@dataclass(frozen=True, slots=True)
class RowDone:
    """One row of a finished device job.

    Attributes:
        token: a token was streamed for it by this job.
        first: that token is the first this daemon produced for the request.
        internal: a warm-up probe's row.
    """

    job_id: str
    token: bool
    first: bool
    internal: bool


@dataclass(frozen=True, slots=True)
class DeviceJobDone:
    """A device job's completion, decided (emitted before its tokens are streamed).

    Attributes:
        batch: rows the submodel takes per job (a decode job's fill is len(rows) / batch).
        stamps: the device's own phase times (device clock), None when it could not say.
        sampling_s: host seconds spent sampling its logits (0 when it was not sampled).
        postprocess_s: host seconds from the wait's return to the settlement, sampling excluded.
        t_submit / t_done: host monotonic times the device accepted it and it was decided (its
            tokens are streamed right after: `t_done` is their time for the inter-token latency).
        faults: device anomalies it showed (FAULT_* kinds).
    """

    device_job_id: int
    task: TaskType
    bank: EngineSlot
    model: str
    generation: int
    status: JobStatus
    rows: tuple[RowDone, ...]
    batch: int
    stamps: JobTimestamps | None
    sampling_s: float
    postprocess_s: float
    t_submit: float
    t_done: float
    faults: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class RequestFinished:
    """A request's Final (once per request), with the usage and timings it reports."""

    job_id: str
    model: str
    generation: int
    reason: FinishReason
    error_kind: ErrorKind | None
    usage: Usage
    timings: Timings
    internal: bool
    t: float


@dataclass(frozen=True, slots=True)
class ResetRecorded:
    """A reset (automatic or operator) entered the audit trail."""

    entry: AuditEntry


@dataclass(frozen=True, slots=True)
class FaultSeen:
    """A device fault outside a job's completion: a hang, or the board that stopped serving."""

    kind: str
    message: str
    t: float


EngineEvent = (
    RequestQueued | RequestRejected | DeviceJobStarted | DeviceJobDone | RequestFinished | ResetRecorded | FaultSeen
)


class EngineObserver(ABC):  # noqa: B024  (every method has a no-op default: override what you need)
    """Receives the engine's events on the hub's thread, in emit order, never under the engine lock.

    A method must not call back into the engine's locked methods in a way that waits for the engine
    (it would only delay later events, never the device). Exceptions are logged by the hub and the
    next event is delivered all the same.
    """

    def request_queued(self, event: RequestQueued) -> None:  # noqa: B027 (a no-op default)
        """A Submit was queued.

        Args:
            event: the request and its submit time.
        Returns:
            Nothing.
        Raises:
            Nothing expected; the hub logs anything raised.
        """

    def request_rejected(self, event: RequestRejected) -> None:  # noqa: B027 (a no-op default)
        """A Submit was refused by admission.

        Args:
            event: the model and why.
        """

    def device_job_started(self, event: DeviceJobStarted) -> None:  # noqa: B027 (a no-op default)
        """The device accepted a device job (for a prefill: its request was admitted).

        Args:
            event: the job, its bank and its rows' requests.
        """

    def device_job_done(self, event: DeviceJobDone) -> None:  # noqa: B027 (a no-op default)
        """A device job completed and was decided; its tokens are about to be streamed.

        Args:
            event: the device's phase timestamps, host sampling time, rows and faults.
        """

    def request_finished(self, event: RequestFinished) -> None:  # noqa: B027 (a no-op default)
        """A request ended (any reason).

        Args:
            event: its finish reason, usage and timings.
        """

    def reset_recorded(self, event: ResetRecorded) -> None:  # noqa: B027 (a no-op default)
        """A device reset ended and was audited.

        Args:
            event: the audit entry.
        """

    def fault_seen(self, event: FaultSeen) -> None:  # noqa: B027 (a no-op default)
        """A hang or a board that stopped serving.

        Args:
            event: its kind and message.
        """


_METHOD: dict[type, str] = {  # event type -> the observer method that receives it
    RequestQueued: "request_queued",
    RequestRejected: "request_rejected",
    DeviceJobStarted: "device_job_started",
    DeviceJobDone: "device_job_done",
    RequestFinished: "request_finished",
    ResetRecorded: "reset_recorded",
    FaultSeen: "fault_seen",
}
_STOP = object()


class ObserverHub:
    """Delivers engine events to its observers on one thread of its own, in emit order.

    Thread-safe. The thread starts with the first observer and ends at `close`.
    """

    def __init__(self) -> None:
        self._observers: tuple[EngineObserver, ...] = ()
        # Event type -> the methods of the observers that override its no-op default. An event no
        # observer handles is not even queued (no wake-up of the hub's thread for it).
        self._routes: dict[type, tuple[Callable[[Any], None], ...]] = {}
        self._queue: SimpleQueue[Any] = SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # guards `_observers` changes and the thread's start

    @property
    def active(self) -> bool:
        """Some observer listens (the engine builds no event otherwise)."""
        return bool(self._observers)

    def wants(self, event_type: type) -> bool:
        """Some observer handles `event_type` (the engine builds no such event otherwise: a job log
        that only wants request events costs nothing per device job)."""
        return event_type in self._routes

    def add(self, observer: EngineObserver) -> None:
        """Deliver every event emitted from now on to `observer` too."""
        with self._lock:
            self._observers = (*self._observers, observer)
            self._routes = _routes(self._observers)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="calculet-observers", daemon=True)
                self._thread.start()

    def emit(self, event: EngineEvent) -> None:
        """Queue an event for delivery (a queue put: safe under any lock, never blocks); dropped when
        no observer handles its type."""
        if type(event) in self._routes:
            self._queue.put(event)

    def flush(self, timeout: float) -> bool:
        """Wait until every event emitted before this call was delivered. Returns whether it was
        within `timeout` seconds (True at once without observers)."""
        if self._thread is None:
            return True
        done = threading.Event()
        self._queue.put(done)
        return done.wait(timeout)

    def close(self, timeout: float = 5.0) -> None:
        """Deliver what is queued, then end the thread (events emitted later are dropped)."""
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(_STOP)
            thread.join(timeout)
        self._observers, self._routes = (), {}

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            if isinstance(item, threading.Event):
                item.set()
                continue
            for method in self._routes.get(type(item), ()):
                try:
                    method(item)
                except Exception:  # one observer's bug must not stop the others or later events
                    owner = type(getattr(method, "__self__", method)).__name__
                    log.exception("engine observer %s failed on %s", owner, type(item).__name__)


def _routes(observers: tuple[EngineObserver, ...]) -> dict[type, tuple[Callable[[Any], None], ...]]:
    """Per event type, the bound methods of the observers that override its no-op default."""
    routes: dict[type, tuple[Callable[[Any], None], ...]] = {}
    for event_type, name in _METHOD.items():
        default = getattr(EngineObserver, name)
        methods = tuple(getattr(o, name) for o in observers if getattr(type(o), name) is not default)
        if methods:
            routes[event_type] = methods
    return routes
