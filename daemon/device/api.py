"""The device contract: abstract classes every board implementation provides (docs/vendor-binding.md).

Data flow: the daemon opens a `VirtualDevice` through a `DeviceDriver` (found by entry point
group `calculet.devices`), configures a model package into a `ConfiguredModel`, registers host
buffers once per buffer-pool slot, and then, for each job, fills its input buffers, calls
`submit` (non-blocking) and later `Submission.wait`. The device reads input buffers at its H2D
time and writes output buffers at its D2H time, so a buffer belongs to the job from submit
until `wait` has returned a finished status. Every call returns or raises a typed
`DeviceError`; no call aborts the process.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import numpy as np

from calculet.daemon.device.types import (
    DeviceInfo,
    EngineSlot,
    JobCounters,
    JobSpec,
    JobStatus,
    JobTimestamps,
    MemoryUsage,
    SubmodelInfo,
)

if TYPE_CHECKING:
    from calculet.daemon.package.manifest import PackageManifest


class HostBuffer:
    """A host array registered with the device (CalRT MapBuf on stable backing memory).

    The array's address must not change while registered: never resize it, only write into it.
    Ownership: the registering component (a JobContext pool slot) owns it; while a job naming it
    is in flight, the device reads or writes it and nobody else may touch its contents.
    """

    def __init__(self, buffer_id: int, array: np.ndarray) -> None:
        self.buffer_id = buffer_id
        self.array = array

    @property
    def nbytes(self) -> int:
        return int(self.array.nbytes)

    def __repr__(self) -> str:
        return f"HostBuffer(id={self.buffer_id}, shape={self.array.shape}, dtype={self.array.dtype})"


class Submission(ABC):
    """Handle of one submitted job (CalRT OutputBuf status + Wait)."""

    job_id: int
    engine_slot: EngineSlot  # the engine bank running it
    spec: JobSpec

    @abstractmethod
    def status(self) -> JobStatus:
        """Current status without blocking.

        Raises:
            DeviceLost: the device stopped answering.
        """

    @abstractmethod
    def wait(self, timeout: float | None = None) -> JobStatus:
        """Block until the job is DONE or CCU_EXCEPTION and its outputs are written (D2H done).

        Args:
            timeout: seconds of wall-clock time to wait; None waits forever.

        Returns:
            The finished status. CCU_EXCEPTION means the outputs and the KV effect are unknown.

        Raises:
            WaitTimeout: the job did not finish in time; its buffers stay held.
            DeviceLost: the device stopped answering.
        """

    @abstractmethod
    def timestamps(self) -> JobTimestamps | None:
        """Modelled device timestamps, or None while the job is not finished."""

    @abstractmethod
    def read_logits_row(self, row: int, out: np.ndarray) -> None:
        """Copy one row of a finished top-k decode job's full logits (bf16 `[vocab]`) into `out`: a
        device-to-host copy of its own, taking its time (`package/logits_output.py`). The rows stay
        on the device until another job reuses the job's output buffers.

        Args:
            row: an active row of the job.
            out: bf16 [vocab] host array.

        Raises:
            InvalidJob: not a finished top-k job, a bad row or array, or its rows are gone.
            DeviceLost: the device stopped answering.
        """


class ConfiguredModel(ABC):
    """A package configured on the device (CalRT Calbin after configure()).

    Attributes:
        config_id: unique per configure call on this device.
        name: the package name.
        submodels: exact name -> submodel description.
        lanes: number of KV lanes.
        lane_context: maximum KV tokens per lane.
        vocab_size: logits width.
        configure_cost: seconds each phase of `configure` took on the device, by phase name
            (calsim: configure, upload, deploy, kv_clear, modelled); empty when the device says nothing.
    """

    config_id: int
    name: str
    submodels: Mapping[str, SubmodelInfo]
    lanes: int
    lane_context: int
    vocab_size: int
    configure_cost: Mapping[str, float] = MappingProxyType({})

    def submodel(self, name: str) -> SubmodelInfo:
        """Exact lookup (docs/sources.md 001 §9: never substring matching).

        Raises:
            KeyError: no submodel has this exact name.
        """
        return self.submodels[name]


class VirtualDevice(ABC):
    """One opened board."""

    @abstractmethod
    def info(self) -> DeviceInfo:
        """Identity, chips and capabilities.

        Raises:
            DeviceLost: the device stopped answering.
        """

    @abstractmethod
    def configure(self, package_dir: Path, manifest: PackageManifest) -> ConfiguredModel:
        """Load a validated package onto the device.

        Args:
            package_dir: the package directory (files are read from here).
            manifest: its parsed manifest.

        Returns:
            The configured model; its KV lanes start empty.

        Raises:
            OutOfDeviceMemory: parameters + KV + workspace do not fit a chip's DRAM/SRAM.
            TooManyConfigurations: the device already holds its maximum of configured models.
            ConfigurationError: the package cannot run on this device.
            DeviceLost: the device stopped answering.
        """

    @abstractmethod
    def release(self, model: ConfiguredModel) -> None:
        """Free the model's device memory. Jobs of the model must all be finished.

        Raises:
            BufferInUse: a job of this model is still in flight.
            ModelReleased: already released.
            DeviceLost: the device stopped answering.
        """

    @abstractmethod
    def register_buffer(self, array: np.ndarray) -> HostBuffer:
        """Register host memory for DMA. The array must be C-contiguous and not resized later.

        Raises:
            InvalidJob: the array is not C-contiguous.
            DeviceLost: the device stopped answering.
        """

    @abstractmethod
    def unregister_buffer(self, buffer: HostBuffer) -> None:
        """Forget a registered buffer.

        Raises:
            BufferInUse: an in-flight job still holds it.
        """

    @abstractmethod
    def submit(self, model: ConfiguredModel, job: JobSpec, engine_slot: EngineSlot = EngineSlot.AUTO) -> Submission:
        """Queue a job without blocking (CalRT infer() / SubmitJob()).

        Returns:
            A submission handle; its buffers and lanes are held until it finishes.

        Raises:
            InvalidJob: malformed job (checked before anything is held).
            StaleKV: a row's past_kv_len exceeds the KV its lane validly holds (a runtime that tracks
                lane lengths, as calsim does, refuses it; one that does not computes on garbage).
            EngineBusy: the engine bank (every bank for AUTO) already has a job in flight.
            BufferInUse: a named buffer is held by an in-flight job.
            LaneBusy: a named lane is being advanced by an in-flight job.
            SubmitFailed: the runtime refused the job; nothing is held.
            ModelReleased: the model handle is stale.
            DeviceLost: the device stopped answering.
        """

    @abstractmethod
    def counters(self) -> JobCounters:
        """Job counters since open (pending/running/finished/left).

        Raises:
            NotImplementedError: the runtime cannot count its jobs; the daemon's device guard then
                synthesises the counters from the submissions it saw (`guard.GuardedDevice`).
        """

    @abstractmethod
    def memory_usage(self) -> MemoryUsage:
        """Bytes used and total per chip."""

    @abstractmethod
    def reset_ccu(self) -> None:
        """Reset the compute units: every in-flight job ends as CCU_EXCEPTION and every lane it
        touched holds unknown KV. Configurations stay.

        Raises:
            DeviceLost: the device stopped answering.
        """

    @abstractmethod
    def open_lane(self, model: ConfiguredModel, lane: int) -> None:
        """Make a KV lane of `model` usable (CalRT KV Apply) before the first job of the sequence that
        takes it. The daemon calls it outside its locks, at most once per lane until `close_lane`.

        Raises:
            OutOfKV: no KV space for the lane now (never an endless retry inside the binding).
            InvalidJob: the lane is out of range.
            ModelReleased: the handle is stale.
            DeviceLost: the device stopped answering.
        """

    @abstractmethod
    def close_lane(self, model: ConfiguredModel, lane: int) -> None:
        """Give a KV lane's space back (CalRT KV Free) after the sequence holding it ended; no job
        uses it any more. The daemon calls it outside its locks, before it opens the lane again. Its
        KV contents are gone: the next job on the lane starts at past_kv_len 0.

        Raises:
            InvalidJob: the lane is out of range.
            ModelReleased: the handle is stale (the daemon ignores this: the lane is gone anyway).
            DeviceLost: the device stopped answering.
        """

    @abstractmethod
    def reset_configuration(self, model: ConfiguredModel) -> None:
        """Reset the configuration, as CalRT 0.7.6's ResetConfiguration does: every configured
        model (calbin), not only `model`, is dropped. Their in-flight jobs end as CCU_EXCEPTION, their
        KV lanes and device memory are gone, and their handles are invalid from now on (every later
        call with one raises ModelReleased). Registered host buffers stay registered. To serve again
        the caller configures each package anew and warms it up.

        Raises:
            ModelReleased: the handle is stale.
            DeviceLost: the device stopped answering.
        """

    @abstractmethod
    def healthy(self) -> bool:
        """False once the device is lost or otherwise unusable without a process restart.

        Must answer at once, without waiting for device work: the daemon calls it on its event loop
        for every Health and WatchLoad report."""

    @abstractmethod
    def close(self) -> None:
        """Release everything and close the device. Idempotent."""


class DeviceDriver(ABC):
    """Factory registered under entry point group `calculet.devices`."""

    name: str

    @abstractmethod
    def open(self, board: int, options: Mapping[str, Any]) -> VirtualDevice:
        """Open board number `board`.

        Args:
            board: board index on this host.
            options: driver-specific settings (calsim: time_scale, fault_plan, dram_bytes, ...).

        Raises:
            DeviceNotFound: no such board.
            DeviceBusy: another process holds the board (the daemon exits with status 3).
            InvalidJob: an option is unknown or malformed (kind INVALID_ARGUMENT).
        """
