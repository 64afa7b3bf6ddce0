"""`GuardedDevice`: the daemon's side of the device contract, enforced in front of any device.

What it guards: every `submit` passes the guard's checks before the wrapped device sees the job
(the buffers it names are registered and free, its lanes are not advanced by another unfinished
job, a bank and the in-flight limit are free, the model is not released, and on a device without
lane selection every row sits on its slot, `slots.py`), `unregister_buffer`
and `release` refuse what an unfinished job still holds, and each call raises the same typed error
(`errors.py`) whatever device is underneath.

Why: the refusals the daemon's tests rely on used to live only in calsim (`engine.py`,
`job_check.py`). CalRT 0.7.6 makes none of them: `infer()` / `SubmitJob()` only queue a job and
report an error code (docs/sources.md 001 §4, §8-9), and a buffer reused before `Wait` or a lane
advanced twice is silently corrupt data (docs/sources.md 000 §4, §7, §14). With a vendor binding the
same daemon bug would pass every test and corrupt results; behind the guard it is the same typed
refusal as on calsim. Wrap whatever `DeviceDriver.open` returns:
`GuardedDevice(load_driver(name).open(board, options))`.

Holds: a job holds its buffers from `submit` until its submission's `wait` has returned a finished
status (the device writes outputs at D2H, which CalRT completes in `Wait`: `api.py`); its lanes, its
bank, its place in the in-flight limit and its model until `status()` or `wait()` has reported a
finished status. `reset_ccu`, `reset_configuration` (which drops every configured model, as the
contract says) and `close` end every job submitted before them and all of its holds. A submit under
way holds what it asked for from its checks until the device has answered (released again if the
device refuses it), so two callers cannot both pass the checks for the same buffer, lane or bank.

Locking: one small `threading.Lock` guards the guard's bookkeeping. It is never held across a call
into the wrapped device: the daemon submits from its engine thread and waits from its completion
thread, and a device call may block. Each method takes the lock to check and reserve, calls the
device without it, then takes it again to commit or undo.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from calculet.daemon.device.api import ConfiguredModel, HostBuffer, Submission, VirtualDevice
from calculet.daemon.device.errors import (
    BufferInUse,
    DeviceLost,
    EngineBusy,
    InvalidJob,
    LaneBusy,
    ModelReleased,
    RowOffSlot,
)
from calculet.daemon.device.slots import check_slot_rows
from calculet.daemon.device.types import (
    DeviceCapabilities,
    DeviceInfo,
    EngineSlot,
    JobCounters,
    JobSpec,
    JobStatus,
    JobTimestamps,
    MemoryUsage,
    RowSpec,
)

if TYPE_CHECKING:
    from calculet.daemon.package.manifest import PackageManifest

BANKS = (EngineSlot.PING, EngineSlot.PONG)


@dataclass(eq=False)
class JobHold:
    """What one job holds in the guard's books.

    Attributes:
        ticket: the guard's number for it (the device's job id is known only after submit).
        model_id: config id of its model.
        buffers: every buffer id it names (inputs and outputs).
        lanes: the KV lanes its rows advance.
        bank: the engine bank it occupies; AUTO while the device has not named one.
        job_id: the device's job id; None while the submit is under way.
        finished: `status()` or `wait()` reported a finished status: lanes, bank and model are free.
    """

    ticket: int
    model_id: int
    buffers: frozenset[int]
    lanes: frozenset[int]
    bank: EngineSlot
    job_id: int | None = None
    finished: bool = False

    def __str__(self) -> str:
        if self.job_id is None:
            return "a job being submitted"
        return f"job {self.job_id}" + (" (finished, but its wait has not returned)" if self.finished else "")


@dataclass(frozen=True)
class GuardView:
    """A copy of the guard's books.

    Attributes:
        unfinished: device job ids not yet reported finished (status or wait).
        unwaited: device job ids whose `wait` has not returned a finished status.
        buffers: buffer ids held (by unwaited jobs and by submits under way).
        lanes: (config id, lane) pairs advanced by unfinished jobs and submits under way.
        registered: buffer ids registered through the guard and not unregistered.
    """

    unfinished: frozenset[int]
    unwaited: frozenset[int]
    buffers: frozenset[int]
    lanes: frozenset[tuple[int, int]]
    registered: frozenset[int]


class GuardedSubmission(Submission):
    """A device's submission, observed: when `status()` or `wait()` reports a finished status the
    guard frees what the job holds (see the module docstring). Other attributes are the wrapped
    submission's (calsim's `history()`, `fault`)."""

    def __init__(self, guard: GuardedDevice, hold: JobHold, inner: Submission) -> None:
        self._guard = guard
        self._hold = hold
        self.inner = inner
        self.job_id = inner.job_id
        self.engine_slot = inner.engine_slot
        self.spec = inner.spec

    def status(self) -> JobStatus:
        status = self.inner.status()
        if status.finished:
            self._guard._observe(self._hold, waited=False)
        return status

    def wait(self, timeout: float | None = None) -> JobStatus:
        status = self.inner.wait(timeout)
        if status.finished:
            self._guard._observe(self._hold, waited=True)
        return status

    def timestamps(self) -> JobTimestamps | None:
        return self.inner.timestamps()

    def read_logits_row(self, row: int, out: np.ndarray) -> None:
        self.inner.read_logits_row(row, out)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def __repr__(self) -> str:
        return f"GuardedSubmission({self.inner!r})"


class GuardedDevice(VirtualDevice):
    """Wraps any `VirtualDevice` and refuses, before delegating `submit`, a job that breaks an
    invariant the daemon relies on. Thread-safe. Checks, in this order:

    - submit: the guard is open (else DeviceLost); the model was not released, nor dropped by a
      configuration reset (ModelReleased); the job is a JobSpec naming each buffer and lane once,
      every buffer registered through this guard and not unregistered (InvalidJob); fewer unfinished
      jobs than the device's declared `max_inflight` and its banks (two with ping/pong, else one),
      and an explicitly requested bank (PING/PONG) not occupied by an unfinished job, nor possibly
      by one whose bank the device has not named (EngineBusy); no named buffer held by an unwaited
      job (BufferInUse); no lane advanced by an unfinished job of the same model (LaneBusy). On a
      device whose capabilities declare no lane selection, the fixed-slot rules of `slots.py`
      (RowOffSlot, before any of the above but the JobSpec's shape): a row on a slot other than its
      index would silently attend over another sequence's KV on such a board.
    - unregister_buffer: the buffer is not held by an unwaited job (BufferInUse).
    - release: the model has no unfinished job (BufferInUse, as `VirtualDevice.release` documents)
      and was not released already (ModelReleased).
    - reset_configuration, open_lane, close_lane: the model was not released, nor dropped by a
      configuration reset (ModelReleased).

    The wrapped device still makes its own checks after these. Every other method delegates, and
    attributes beyond the contract (calsim's `inject`, `fault_plan`, ...) are the wrapped device's.

    Args:
        device: the device to guard (calsim, a vendor binding, a test fake).
    """

    def __init__(self, device: VirtualDevice) -> None:
        self.wrapped = device
        self._lock = threading.Lock()
        self._tickets = itertools.count(1)
        self._jobs: dict[int, JobHold] = {}  # ticket -> hold, until waited, reset or closed
        self._buffers: dict[int, HostBuffer] = {}  # registered through the guard
        self._live: set[int] = set()  # config ids of models configured or used through the guard
        self._dropped: set[int] = set()  # config ids released or dropped by a configuration reset
        self._caps: DeviceCapabilities | None = None
        self._closed = False
        self._accepted = 0  # jobs the device accepted through the guard (synthesised counters)
        self._ended = 0  # of those, the ones seen finished or ended by a reset or close

    # ------------------------------------------------------------------ books

    def view(self) -> GuardView:
        """A copy of what the guard holds now."""
        with self._lock:
            holds = list(self._jobs.values())
            return GuardView(
                unfinished=frozenset(h.job_id for h in holds if h.job_id is not None and not h.finished),
                unwaited=frozenset(h.job_id for h in holds if h.job_id is not None),
                buffers=frozenset(b for h in holds for b in h.buffers),
                lanes=frozenset((h.model_id, lane) for h in holds if not h.finished for lane in h.lanes),
                registered=frozenset(self._buffers),
            )

    def _observe(self, hold: JobHold, *, waited: bool) -> None:
        """The device reported `hold`'s job finished; after a wait its buffers are free too."""
        with self._lock:
            if not hold.finished and hold.ticket in self._jobs:
                self._ended += 1
            hold.finished = True
            if waited:
                self._jobs.pop(hold.ticket, None)

    def _end_jobs(self, tickets: list[int]) -> None:
        """A reset ended these jobs: nothing of theirs is held any more."""
        with self._lock:
            for ticket in tickets:
                hold = self._jobs.pop(ticket, None)
                if hold is not None and not hold.finished:
                    self._ended += 1

    def _submitted_tickets(self) -> list[int]:
        """Tickets of jobs the device has accepted (a submit under way is not one yet)."""
        with self._lock:
            return [t for t, h in self._jobs.items() if h.job_id is not None]

    def _capabilities(self) -> DeviceCapabilities:
        caps = self._caps
        if caps is None:
            caps = self.wrapped.info().capabilities  # a device call: without the lock
            self._caps = caps
        return caps

    # ------------------------------------------------------------------ jobs

    def submit(self, model: ConfiguredModel, job: JobSpec, engine_slot: EngineSlot = EngineSlot.AUTO) -> Submission:
        """See `VirtualDevice.submit`; the class docstring lists what the guard refuses first."""
        if not isinstance(job, JobSpec):
            raise InvalidJob(f"submit needs a JobSpec, got {type(job).__name__}")
        if not isinstance(engine_slot, EngineSlot):
            raise InvalidJob(f"engine_slot must be an EngineSlot, got {engine_slot!r}")
        buffer_ids = _named_buffers(job)
        caps = self._capabilities()
        lanes = _named_lanes(job, fixed_slots=not caps.lane_selection)
        _check_slots(model, job, caps)
        config_id = model.config_id
        with self._lock:
            if self._closed:
                raise DeviceLost("the guarded device is closed")
            if config_id in self._dropped:
                raise ModelReleased(f"model {model.name!r} (config {config_id}) was released or reset")
            unknown = [b for b in buffer_ids if b not in self._buffers]
            if unknown:
                raise InvalidJob(f"job names buffer(s) {unknown} not registered on this device")
            self._check_bank(caps, engine_slot)
            for buffer_id in buffer_ids:
                holder = next((h for h in self._jobs.values() if buffer_id in h.buffers), None)
                if holder is not None:
                    raise BufferInUse(f"buffer {buffer_id} is held by {holder}")
            for lane in lanes:
                holder = next(
                    (h for h in self._jobs.values() if not h.finished and h.model_id == config_id and lane in h.lanes),
                    None,
                )
                if holder is not None:
                    raise LaneBusy(f"lane {lane} of model {model.name!r} is being advanced by {holder}")
            hold = JobHold(next(self._tickets), config_id, frozenset(buffer_ids), frozenset(lanes), engine_slot)
            self._jobs[hold.ticket] = hold
            self._live.add(config_id)
        try:
            inner = self.wrapped.submit(model, job, engine_slot)
        except BaseException:
            with self._lock:
                self._jobs.pop(hold.ticket, None)
            raise
        with self._lock:
            self._accepted += 1
            hold.job_id = inner.job_id
            if hold.bank is EngineSlot.AUTO and inner.engine_slot in BANKS:
                hold.bank = inner.engine_slot
        return GuardedSubmission(self, hold, inner)

    def _check_bank(self, caps: DeviceCapabilities, requested: EngineSlot) -> None:
        """Raises:
        EngineBusy: the in-flight limit is reached, or the requested bank is (or may be) taken."""
        unfinished = [h for h in self._jobs.values() if not h.finished]
        banks = len(BANKS) if caps.ping_pong else 1
        limit = min(caps.max_inflight, banks)
        if len(unfinished) >= limit:
            jobs = ", ".join(str(h) for h in unfinished)
            raise EngineBusy(f"the device takes {limit} job(s) in flight at once and has {len(unfinished)}: {jobs}")
        if requested is not EngineSlot.AUTO:
            holder = next((h for h in unfinished if h.bank in (requested, EngineSlot.AUTO)), None)
            if holder is not None:
                taken = "has" if holder.bank is requested else "may have (the device named no bank for it)"
                raise EngineBusy(f"engine bank {requested.value} {taken} {holder} in flight")

    def counters(self) -> JobCounters:
        """The device's counters; when its runtime cannot count (`NotImplementedError`), the guard's
        own: jobs it saw accepted and finished. `left` may then run ahead of the device (a finished
        job counts once someone asked its status), never behind, which is what the daemon's
        consistency check needs."""
        try:
            return self.wrapped.counters()
        except NotImplementedError:
            with self._lock:
                left = self._accepted - self._ended
                return JobCounters(self._accepted, 0, left, self._ended, left)

    # ------------------------------------------------------------------ buffers

    def register_buffer(self, array: np.ndarray) -> HostBuffer:
        buf = self.wrapped.register_buffer(array)
        with self._lock:
            if not self._closed:
                self._buffers[buf.buffer_id] = buf
        return buf

    def unregister_buffer(self, buffer: HostBuffer) -> None:
        """See `VirtualDevice.unregister_buffer`. A buffer the guard does not know goes to the
        device, which decides."""
        buffer_id = buffer.buffer_id if isinstance(buffer, HostBuffer) else None
        known = False
        with self._lock:
            holder = next((h for h in self._jobs.values() if buffer_id in h.buffers), None)
            if holder is not None:
                raise BufferInUse(f"buffer {buffer_id} is held by {holder}")
            if buffer_id is not None and self._buffers.get(buffer_id) is buffer:
                known = True
                del self._buffers[buffer_id]  # no submit may name it while the device forgets it
        try:
            self.wrapped.unregister_buffer(buffer)
        except BaseException:
            if known and buffer_id is not None:
                with self._lock:
                    if not self._closed:
                        self._buffers.setdefault(buffer_id, buffer)
            raise

    # ------------------------------------------------------------------ models

    def configure(self, package_dir: Path, manifest: PackageManifest) -> ConfiguredModel:
        model = self.wrapped.configure(package_dir, manifest)
        with self._lock:
            self._live.add(model.config_id)
        return model

    def release(self, model: ConfiguredModel) -> None:
        """See `VirtualDevice.release`: an unfinished job of the model is BufferInUse."""
        config_id = model.config_id
        with self._lock:
            if config_id in self._dropped:
                raise ModelReleased(f"model {model.name!r} (config {config_id}) was already released or reset")
            busy = [h for h in self._jobs.values() if h.model_id == config_id and not h.finished]
            if busy:
                raise BufferInUse(f"model {model.name!r} has {', '.join(map(str, busy))} in flight")
            self._dropped.add(config_id)  # no submit for it while the device releases it
        try:
            self.wrapped.release(model)
        except BaseException as exc:
            if not isinstance(exc, ModelReleased):  # the device kept the model
                with self._lock:
                    self._dropped.discard(config_id)
            raise
        with self._lock:
            self._live.discard(config_id)

    def reset_configuration(self, model: ConfiguredModel) -> None:
        """See `VirtualDevice.reset_configuration`: afterwards every job submitted before it has
        ended and every configured model is dropped (their handles are ModelReleased here)."""
        self._refuse_dropped(model)
        ended = self._submitted_tickets()
        self.wrapped.reset_configuration(model)
        self._end_jobs(ended)
        with self._lock:
            self._dropped |= self._live | {model.config_id}
            self._live.clear()

    def open_lane(self, model: ConfiguredModel, lane: int) -> None:
        self._refuse_dropped(model)
        self.wrapped.open_lane(model, lane)

    def close_lane(self, model: ConfiguredModel, lane: int) -> None:
        self._refuse_dropped(model)
        self.wrapped.close_lane(model, lane)

    def _refuse_dropped(self, model: ConfiguredModel) -> None:
        """Raises:
        ModelReleased: the guard saw the model released or dropped by a configuration reset."""
        with self._lock:
            if model.config_id in self._dropped:
                raise ModelReleased(f"model {model.name!r} (config {model.config_id}) was released or reset")

    def memory_usage(self) -> MemoryUsage:
        return self.wrapped.memory_usage()

    # ------------------------------------------------------------------ device

    def info(self) -> DeviceInfo:
        return self.wrapped.info()

    def healthy(self) -> bool:
        return self.wrapped.healthy()

    def reset_ccu(self) -> None:
        """See `VirtualDevice.reset_ccu`: afterwards every job submitted before it has ended."""
        ended = self._submitted_tickets()
        self.wrapped.reset_ccu()
        self._end_jobs(ended)

    def close(self) -> None:
        """Close the wrapped device; every job has ended then and every buffer and model is gone."""
        try:
            self.wrapped.close()
        finally:
            with self._lock:
                self._closed = True
                self._jobs.clear()
                self._buffers.clear()
                self._dropped |= self._live
                self._live.clear()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name == "wrapped":
            raise AttributeError(name)
        return getattr(self.wrapped, name)

    def __repr__(self) -> str:
        return f"GuardedDevice({self.wrapped!r})"


def _named_buffers(job: JobSpec) -> list[int]:
    """Raises:
    InvalidJob: inputs/outputs are not mappings to integer ids, or one buffer is named twice."""
    if not isinstance(job.inputs, Mapping) or not isinstance(job.outputs, Mapping):
        raise InvalidJob("job inputs and outputs must map tensor names to buffer ids")
    ids = [*job.inputs.values(), *job.outputs.values()]
    if any(isinstance(i, bool) or not isinstance(i, int) for i in ids):
        raise InvalidJob(f"job buffer ids must be integers, got {ids}")
    if len(set(ids)) != len(ids):
        raise InvalidJob(f"one buffer is named twice in the job ({ids})")
    return ids


def _check_slots(model: ConfiguredModel, job: JobSpec, caps: DeviceCapabilities) -> None:
    """The fixed-slot rules (`slots.py`) for the job's submodel; a submodel the model does not have
    is the device's to refuse, but never with a masked row.

    Raises:
        RowOffSlot: see `check_slot_rows`."""
    sub = model.submodels.get(job.submodel) if isinstance(job.submodel, str) else None
    if sub is not None:
        check_slot_rows(job.rows, sub, caps.lane_selection, caps.inactive_rows)
    elif any(row.is_masked for row in job.rows):
        raise RowOffSlot(f"a masked row in a job of unknown submodel {job.submodel!r}")


def _named_lanes(job: JobSpec, *, fixed_slots: bool) -> list[int]:
    """The lanes the job's rows advance (with `fixed_slots`, a masked row's slot is not one: another
    job may advance that lane meanwhile).

    Raises:
        InvalidJob: rows are not a sequence of RowSpecs with integer lanes, or a lane appears twice."""
    if not isinstance(job.rows, tuple | list):
        raise InvalidJob(f"job rows must be a tuple of RowSpec, got {type(job.rows).__name__}")
    lanes: list[int] = []
    for i, row in enumerate(job.rows):
        if not isinstance(row, RowSpec) or isinstance(row.lane, bool) or not isinstance(row.lane, int):
            raise InvalidJob(f"row {i}: expected a RowSpec with an integer lane, got {row!r}")
        if row.lane in lanes:
            raise InvalidJob(f"row {i}: lane {row.lane} appears twice in one job")
        lanes.append(row.lane)
    return [row.lane for row in job.rows if not (fixed_slots and row.is_masked)]


__all__ = ["GuardView", "GuardedDevice", "GuardedSubmission", "JobHold"]
