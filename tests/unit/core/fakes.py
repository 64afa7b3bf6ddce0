"""A minimal in-memory `VirtualDevice` for core unit tests.

It keeps the contract's bookkeeping that the core relies on, and nothing else: registered buffers
(with a count of how often each array was registered), buffers and lanes held by in-flight jobs
(`unregister_buffer` raises `BufferInUse` for them), submissions that finish only when the test calls
`finish` (or a reset ends them), and a register failure injected after N registrations. It computes
nothing: outputs are left as they are.
"""

from __future__ import annotations

import itertools
import threading
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from calculet.daemon.device.api import ConfiguredModel, HostBuffer, Submission, VirtualDevice
from calculet.daemon.device.errors import (
    BufferInUse,
    ConfigurationError,
    DeviceLost,
    EngineBusy,
    InvalidJob,
    LaneBusy,
    ModelReleased,
    OutOfKV,
    WaitTimeout,
)
from calculet.daemon.device.types import (
    ChipInfo,
    ChipMemory,
    DeviceCapabilities,
    DeviceInfo,
    EngineSlot,
    InactiveRows,
    JobCounters,
    JobSpec,
    JobStatus,
    JobTimestamps,
    MemoryUsage,
    SubmodelInfo,
    TaskType,
    TensorSpec,
)

if TYPE_CHECKING:
    from calculet.daemon.package.manifest import PackageManifest


def submodel(name: str, task: TaskType, batch: int, max_tokens: int, vocab: int) -> SubmodelInfo:
    """A submodel with the contract's standard tensors."""
    return SubmodelInfo(
        name=name,
        task_type=task,
        batch=batch,
        max_tokens=max_tokens,
        inputs=(
            TensorSpec("tokens", (batch, max_tokens), "int32"),
            TensorSpec("positions", (batch, max_tokens), "int32"),
        ),
        outputs=(TensorSpec("logits", (batch, vocab), "bf16"),),
    )


class FakeModel(ConfiguredModel):
    def __init__(
        self, config_id: int, submodels: Mapping[str, SubmodelInfo], lanes: int, lane_context: int, vocab: int
    ) -> None:
        self.config_id = config_id
        self.name = "fake"
        self.submodels = dict(submodels)
        self.lanes = lanes
        self.lane_context = lane_context
        self.vocab_size = vocab
        self.released = False
        self.open_lanes: set[int] = set()


class FakeSubmission(Submission):
    def __init__(self, job_id: int, engine_slot: EngineSlot, spec: JobSpec) -> None:
        self.job_id = job_id
        self.engine_slot = engine_slot
        self.spec = spec
        self._status = JobStatus.PENDING
        self._done = threading.Event()

    def status(self) -> JobStatus:
        return self._status

    def wait(self, timeout: float | None = None) -> JobStatus:
        if not self._done.wait(timeout):
            raise WaitTimeout(f"fake job {self.job_id} not finished after {timeout} s")
        return self._status

    def timestamps(self) -> JobTimestamps | None:
        return JobTimestamps(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0) if self._done.is_set() else None

    def read_logits_row(self, row: int, out: np.ndarray) -> None:
        raise InvalidJob(f"fake job {self.job_id}: the fake device has no top-k packages")

    def _finish(self, status: JobStatus) -> None:
        self._status = status
        self._done.set()


class FakeDevice(VirtualDevice):
    """Args:
    fail_register_after: the registration after this many successful ones raises DeviceLost.
    ping_pong: declare two engine banks (max in-flight 2) instead of one.
    lane_selection / inactive_rows: the declared slot capabilities (`device/slots.py`).
    """

    def __init__(
        self,
        *,
        fail_register_after: int | None = None,
        ping_pong: bool = False,
        lane_selection: bool = True,
        inactive_rows: InactiveRows = InactiveRows.ONLY_VALID,
    ) -> None:
        self.lane_selection = lane_selection
        self.inactive_rows = inactive_rows
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._jobs = itertools.count(1)
        self._configs = itertools.count(1)
        self.fail_register_after = fail_register_after
        self.ping_pong = ping_pong
        self.registered: dict[int, HostBuffer] = {}
        self.array_registrations: Counter[int] = Counter()  # id(array) -> times registered
        self.unregistered: list[int] = []
        self.held: set[int] = set()  # buffer ids held by in-flight jobs (tests may add their own)
        self.inflight: dict[int, tuple[FakeSubmission, FakeModel]] = {}
        self.finished = 0
        self.lost = False
        self.models: list[FakeModel] = []  # every model configured, released or not
        self.kv_lanes_available = 1 << 30  # lanes open_lane grants per model before OutOfKV

    # ---- test helpers --------------------------------------------------------------------

    def finish(self, sub: FakeSubmission, status: JobStatus = JobStatus.DONE) -> None:
        """End an in-flight job: its buffers and lanes are free again."""
        with self._lock:
            self._end(sub, status)

    # ---- VirtualDevice -------------------------------------------------------------------

    def info(self) -> DeviceInfo:
        self._alive()
        return DeviceInfo(
            name="fake",
            board_index=0,
            chips=(ChipInfo(0, 1 << 30, 1 << 20), ChipInfo(1, 1 << 30, 1 << 20)),
            runtime_version="0.7.6",
            driver_version="fake",
            firmware_version="fake",
            capabilities=DeviceCapabilities(
                max_inflight=2 if self.ping_pong else 1,
                ping_pong=self.ping_pong,
                max_resident_configurations=1,
                lane_selection=self.lane_selection,
                inactive_rows=self.inactive_rows,
            ),
        )

    def configure(self, package_dir: Path, manifest: PackageManifest) -> ConfiguredModel:
        """Describe the manifest's submodels and KV; reads no files."""
        bad = [s.name for s in manifest.submodels if s.role not in {t.value for t in TaskType}]
        if bad:
            raise ConfigurationError(f"submodels with unknown roles: {bad}")
        subs = {
            s.name: SubmodelInfo(
                name=s.name,
                task_type=TaskType(s.role),
                batch=s.batch,
                max_tokens=s.max_tokens,
                inputs=tuple(TensorSpec(t.name, t.shape, t.dtype) for t in s.inputs),
                outputs=tuple(TensorSpec(t.name, t.shape, t.dtype) for t in s.outputs),
            )
            for s in manifest.submodels
        }
        return self.configure_fake(subs, manifest.kv.lanes, manifest.kv.lane_context, manifest.architecture.vocab_size)

    def configure_fake(
        self, submodels: Mapping[str, SubmodelInfo], lanes: int, lane_context: int, vocab: int
    ) -> FakeModel:
        """`configure` without a package: a model with these submodels and KV lanes."""
        self._alive()
        model = FakeModel(next(self._configs), submodels, lanes, lane_context, vocab)
        self.models.append(model)
        return model

    def release(self, model: ConfiguredModel) -> None:
        self._alive()
        assert isinstance(model, FakeModel)
        with self._lock:
            if model.released:
                raise ModelReleased(f"model {model.config_id} already released")
            if any(m is model for _, m in self.inflight.values()):
                raise BufferInUse(f"model {model.config_id} has jobs in flight")
            model.released = True

    def register_buffer(self, array: np.ndarray) -> HostBuffer:
        self._alive()
        if not array.flags.c_contiguous:
            raise InvalidJob("buffer must be C-contiguous")
        with self._lock:
            if self.fail_register_after is not None and len(self.registered) >= self.fail_register_after:
                raise DeviceLost("injected: register_buffer failed")
            buf = HostBuffer(next(self._ids), array)
            self.registered[buf.buffer_id] = buf
            self.array_registrations[id(array)] += 1
            return buf

    def unregister_buffer(self, buffer: HostBuffer) -> None:
        with self._lock:
            if buffer.buffer_id not in self.registered:
                raise InvalidJob(f"buffer {buffer.buffer_id} is not registered")
            if buffer.buffer_id in self.held:
                raise BufferInUse(f"buffer {buffer.buffer_id} is held by an in-flight job")
            del self.registered[buffer.buffer_id]
            self.unregistered.append(buffer.buffer_id)

    def submit(self, model: ConfiguredModel, job: JobSpec, engine_slot: EngineSlot = EngineSlot.AUTO) -> Submission:
        self._alive()
        assert isinstance(model, FakeModel)
        with self._lock:
            if model.released:
                raise ModelReleased(f"model {model.config_id} was released")
            if job.submodel not in model.submodels:
                raise InvalidJob(f"unknown submodel {job.submodel!r}")
            ids = [*job.inputs.values(), *job.outputs.values()]
            if any(i not in self.registered for i in ids):
                raise InvalidJob("job names an unregistered buffer")
            if any(i in self.held for i in ids):
                raise BufferInUse("job names a buffer held by an in-flight job")
            busy_lanes = {r.lane for sub, _ in self.inflight.values() for r in sub.spec.rows}
            if any(r.lane in busy_lanes for r in job.rows):
                raise LaneBusy("job names a lane another in-flight job advances")
            if len(self.inflight) >= (2 if self.ping_pong else 1):
                raise EngineBusy("every engine bank is busy")
            sub = FakeSubmission(next(self._jobs), engine_slot, job)
            self.held.update(ids)
            self.inflight[sub.job_id] = (sub, model)
            return sub

    def counters(self) -> JobCounters:
        with self._lock:
            n = len(self.inflight)
            return JobCounters(self.finished + n, n, 0, self.finished, n)

    def memory_usage(self) -> MemoryUsage:
        return MemoryUsage((ChipMemory(0, 0, 1 << 30, 0, 1 << 20), ChipMemory(1, 0, 1 << 30, 0, 1 << 20)))

    def reset_ccu(self) -> None:
        self._alive()
        with self._lock:
            for sub, _ in list(self.inflight.values()):
                self._end(sub, JobStatus.CCU_EXCEPTION)

    def open_lane(self, model: ConfiguredModel, lane: int) -> None:
        self._alive()
        assert isinstance(model, FakeModel)
        with self._lock:
            if model.released:
                raise ModelReleased(f"model {model.config_id} was released")
            if lane in model.open_lanes or len(model.open_lanes) >= self.kv_lanes_available:
                raise OutOfKV(f"no KV space for lane {lane} ({len(model.open_lanes)} open)")
            model.open_lanes.add(lane)

    def close_lane(self, model: ConfiguredModel, lane: int) -> None:
        self._alive()
        assert isinstance(model, FakeModel)
        with self._lock:
            if model.released:
                raise ModelReleased(f"model {model.config_id} was released")
            model.open_lanes.discard(lane)

    def reset_configuration(self, model: ConfiguredModel) -> None:
        """As on CalRT 0.7.6: every configured model is dropped, its jobs end CCU_EXCEPTION."""
        self._alive()
        assert isinstance(model, FakeModel)
        with self._lock:
            if model.released:
                raise ModelReleased(f"model {model.config_id} was released")
            for sub, _ in list(self.inflight.values()):
                self._end(sub, JobStatus.CCU_EXCEPTION)
            for m in self.models:
                m.released = True

    def healthy(self) -> bool:
        return not self.lost

    def close(self) -> None:
        with self._lock:
            for sub, _ in list(self.inflight.values()):
                self._end(sub, JobStatus.CCU_EXCEPTION)
            self.registered.clear()

    # ---- internals -----------------------------------------------------------------------

    def _alive(self) -> None:
        if self.lost:
            raise DeviceLost("fake device lost")

    def _end(self, sub: FakeSubmission, status: JobStatus) -> None:
        if self.inflight.pop(sub.job_id, None) is None:
            return
        self.held.difference_update([*sub.spec.inputs.values(), *sub.spec.outputs.values()])
        self.finished += 1
        sub._finish(status)
