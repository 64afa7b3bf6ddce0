"""calsim's implementation of the device contract: `CalsimDriver` -> `CalsimDevice`, with
`CalsimModel` (configured packages) and `CalsimSubmission` (job handles), defined in `handles.py`.

Data flow: `CalsimDriver.open` parses the options, holds the board's lock for this process
(`device_lock`: another process opening the board gets DeviceBusy, as from a real runtime) and
opens a `CalsimDevice` (which gives the hold back at `close`). The device owns the one lock +
condition of the board, the `MemoryMap`, the registered host buffers, the configured models (each
with its `Kernel`, which owns the model's KV lanes), the `FaultPlan` and the `ComputeEngine` (banks,
clock, worker thread). `submit` numbers the attempt, asks the fault plan, checks
the job completely (`job_check`) and only then holds bank, buffers and lanes in the engine.
Ownership of host buffers: the caller owns them; between an accepted submit and the job's
finish the engine holds them: it reads inputs at H2D and keeps the outputs it computes at D2H, which
reach the host buffers only when `wait` returns DONE (poison before). With the `checks` option (the
default) it refuses held buffers to other jobs (BufferInUse) and to `unregister_buffer`.
"""

from __future__ import annotations

import itertools
import os
import threading
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from calculet.daemon.calsim.device_lock import BoardHold, hold_board, state_dir
from calculet.daemon.calsim.engine import ComputeEngine
from calculet.daemon.calsim.faults import Fault, FaultKind, FaultPlan
from calculet.daemon.calsim.handles import CalsimModel, CalsimSubmission, ConfigState
from calculet.daemon.calsim.job_check import resolve_job
from calculet.daemon.calsim.kernel import Kernel
from calculet.daemon.calsim.memory import MemoryMap, chip_needs
from calculet.daemon.calsim.model_check import build_submodels, check_timing
from calculet.daemon.calsim.offset_blind import OffsetBlindKernel
from calculet.daemon.calsim.options import CalsimOptions, parse_options
from calculet.daemon.calsim.switch_cost import configure_cost
from calculet.daemon.calsim.timing import job_durations
from calculet.daemon.device.api import ConfiguredModel, DeviceDriver, HostBuffer, VirtualDevice
from calculet.daemon.device.errors import (
    BufferInUse,
    ConfigurationError,
    DeviceNotFound,
    InvalidJob,
    ModelReleased,
    SubmitFailed,
    TooManyConfigurations,
)
from calculet.daemon.device.types import (
    ChipInfo,
    DeviceCapabilities,
    DeviceInfo,
    EngineSlot,
    JobCounters,
    JobSpec,
    MemoryUsage,
)
from calculet.daemon.package.manifest import KERNELS as KERNEL_KINDS
from calculet.daemon.package.manifest import PackageManifest

RUNTIME_VERSION = "0.7.6-calsim"  # the driver and firmware versions come from the profile (options.py)


class CalsimDevice(VirtualDevice):
    """One emulated board (2 chips, ping/pong banks, one compute unit). Thread-safe.

    Args:
        board: board index.
        options: parsed driver options.
        hold: the board's lock held for this device (`CalsimDriver.open`), released at `close` or
            when the device is garbage-collected; None: this device holds none.
    """

    def __init__(self, board: int, options: CalsimOptions, hold: BoardHold | None = None) -> None:
        self._release_hold = weakref.finalize(self, hold.release) if hold is not None else None
        self._cond = threading.Condition()
        self._options = options
        self._plan: FaultPlan = options.fault_plan
        self._memory = MemoryMap(options.chips, options.dram_bytes, options.sram_bytes)
        self._models: dict[int, CalsimModel] = {}
        self._open_lanes: dict[int, set[int]] = {}  # config id -> lanes opened (KV Apply) and not closed
        self._configuring: set[int] = set()  # config ids reserved while their kernel is built
        self._buffers: dict[int, HostBuffer] = {}
        self._config_ids = itertools.count(1)
        self._buffer_ids = itertools.count(1)
        self._closed = False
        self._closing = threading.Event()  # set at close: a paced configure stops waiting
        self._attempts = 0  # every submit call, 0-based: the fault plan's job index
        chips = tuple(ChipInfo(c, options.dram_bytes, options.sram_bytes) for c in range(options.chips))
        caps = DeviceCapabilities(
            max_inflight=2,
            ping_pong=True,
            max_resident_configurations=options.max_resident_configurations,  # from the profile
            lane_selection=options.lane_selection,  # false: fixed slots (`device/slots.py`)
            kernel_kinds=KERNEL_KINDS,
            inactive_rows=options.inactive_rows,
        )
        self._info = DeviceInfo(
            "calsim", board, chips, RUNTIME_VERSION, options.driver_version, options.firmware_version, caps
        )
        self._engine = ComputeEngine(
            self._cond, options.time_scale, self._plan.seed, f"calsim-board{board}", checks=options.checks
        )
        self._engine.start()

    # ------------------------------------------------------------------ identity

    def info(self) -> DeviceInfo:
        with self._cond:
            self._engine.ensure_alive()
            return self._info

    def healthy(self) -> bool:
        with self._cond:
            return self._engine.gone is None

    # ------------------------------------------------------------------ models

    def configure(self, package_dir: Path, manifest: PackageManifest) -> CalsimModel:
        """See `VirtualDevice.configure`. Checks, in order: device alive, the package can run here
        (ConfigurationError), resident limit, memory per chip; then builds the kernel with the
        memory already reserved, so a concurrent configure cannot take it, and takes the modelled
        switch cost (`switch_cost`: configure, upload, deploy, KV clear) x configure_time_scale."""
        submodels = build_submodels(manifest)
        check_timing(manifest)
        with self._cond:
            self._engine.ensure_alive()
            needs = chip_needs(manifest, self._options.chips)
            limit = self._options.max_resident_configurations
            if len(self._models) + len(self._configuring) >= limit:
                raise TooManyConfigurations(
                    f"board holds {len(self._models)} configured model(s) (+{len(self._configuring)} "
                    f"configuring); the limit is {limit} (profile {self._options.profile}, "
                    f"driver {self._options.driver_version})"
                )
            config_id = next(self._config_ids)
            self._memory.reserve(config_id, needs, f"package {manifest.name!r}")
            self._configuring.add(config_id)
        cost = configure_cost(manifest, needs)
        try:
            kernel = self._build_kernel(manifest, Path(package_dir))
            # Paced like jobs: the switch's modelled time passes (a close cuts it short).
            self._closing.wait(sum(cost.values()) * self._options.configure_time_scale)
        except BaseException:
            with self._cond:
                self._configuring.discard(config_id)
                self._memory.release(config_id)
            raise
        with self._cond:
            self._configuring.discard(config_id)
            if self._engine.gone is not None:
                self._memory.release(config_id)
                self._engine.ensure_alive()
            model = CalsimModel(self, config_id, manifest, Path(package_dir), submodels, kernel, needs, cost)
            self._models[config_id] = model
            return model

    def _build_kernel(self, manifest: PackageManifest, package_dir: Path) -> Kernel:
        kv = manifest.kv
        try:
            kernel = self._options.kernel_factory(manifest, package_dir, kv.lanes, kv.lane_context)
        except (ValueError, OSError) as exc:
            raise ConfigurationError(f"package {manifest.name!r}: calsim kernel: {exc}") from exc
        if not isinstance(kernel, Kernel):
            raise ConfigurationError(f"package {manifest.name!r}: kernel factory returned {type(kernel).__name__}")
        if self._options.prefill_ignores_offset:
            kernel = OffsetBlindKernel(kernel)
        if kernel.vocab_size != manifest.architecture.vocab_size:
            raise ConfigurationError(
                f"package {manifest.name!r}: kernel vocab {kernel.vocab_size} != "
                f"manifest vocab {manifest.architecture.vocab_size}"
            )
        return kernel

    def _own(self, model: ConfiguredModel) -> CalsimModel:
        """Raises:
        ModelReleased: not a live model of this device."""
        if (
            not isinstance(model, CalsimModel)
            or model.owner is not self
            or self._models.get(model.config_id) is not model
        ):
            raise ModelReleased(f"{model!r} is not configured on this calsim board (released or foreign)")
        return model

    def release(self, model: ConfiguredModel) -> None:
        with self._cond:
            self._engine.ensure_alive()
            m = self._own(model)
            busy = self._engine.holds_model(m.config_id)
            if busy:
                raise BufferInUse(f"model {m.name!r} has job(s) {[j.job_id for j in busy]} in flight")
            m.state.move(ConfigState.RELEASED)
            del self._models[m.config_id]
            self._open_lanes.pop(m.config_id, None)
            self._memory.release(m.config_id, self._options.release_leak_bytes)

    def memory_usage(self) -> MemoryUsage:
        with self._cond:
            self._engine.ensure_alive()
            return self._memory.usage()

    # ------------------------------------------------------------------ buffers

    def register_buffer(self, array: np.ndarray) -> HostBuffer:
        if not isinstance(array, np.ndarray):
            raise InvalidJob(f"register_buffer needs a numpy array, got {type(array).__name__}")
        if not array.flags.c_contiguous:
            raise InvalidJob(f"register_buffer needs a C-contiguous array (shape {array.shape}, {array.dtype})")
        with self._cond:
            self._engine.ensure_alive()
            buf = HostBuffer(next(self._buffer_ids), array)
            self._buffers[buf.buffer_id] = buf
            return buf

    def unregister_buffer(self, buffer: HostBuffer) -> None:
        """See `VirtualDevice.unregister_buffer`; also raises InvalidJob for a buffer that is not
        registered here."""
        with self._cond:
            self._engine.ensure_alive()
            if not isinstance(buffer, HostBuffer) or self._buffers.get(buffer.buffer_id) is not buffer:
                raise InvalidJob(f"{buffer!r} is not registered on this device")
            holder = self._engine.buffer_holder(buffer.buffer_id)
            if holder is not None:
                raise BufferInUse(f"buffer {buffer.buffer_id} is held by in-flight job {holder.job_id}")
            del self._buffers[buffer.buffer_id]
            self._engine.forget_buffer(buffer.buffer_id)

    # ------------------------------------------------------------------ jobs

    def submit(
        self, model: ConfiguredModel, job: JobSpec, engine_slot: EngineSlot = EngineSlot.AUTO
    ) -> CalsimSubmission:
        """See `VirtualDevice.submit`. Order of checks: device alive; the attempt gets its index
        and fault (device_lost fires here); model handle (ModelReleased); the job (InvalidJob); a row
        past its lane's valid KV (StaleKV); bank (EngineBusy); buffers (BufferInUse); lanes
        (LaneBusy); injected submit_error (SubmitFailed). Only then is anything held."""
        with self._cond:
            self._engine.ensure_alive()
            index = self._attempts
            self._attempts += 1
            fault = self._plan.select(index)
            if fault is not None and fault.kind is FaultKind.DEVICE_LOST:
                self._engine.lose(f"calsim board lost (injected device_lost at submit attempt {index})")
                self._engine.ensure_alive()
            m = self._own(model)
            if not isinstance(job, JobSpec):
                raise InvalidJob(f"submit needs a JobSpec, got {type(job).__name__}")
            if not isinstance(engine_slot, EngineSlot):
                raise InvalidJob(f"engine_slot must be an EngineSlot, got {engine_slot!r}")
            resolved = resolve_job(job, m.geometry, self._buffers, self._info.capabilities)
            m.kv.check(resolved.active)
            bank = self._engine.pick_bank(engine_slot)
            self._engine.check_free(m.config_id, resolved)
            if fault is not None and fault.kind is FaultKind.SUBMIT_ERROR:
                raise SubmitFailed(f"runtime refused submit attempt {index} (injected submit_error)")
            sub = resolved.submodel
            durations = job_durations(
                m.manifest.timing,
                sub.task_type,
                sub.batch,
                resolved.rows,
                resolved.input_bytes,
                resolved.output_bytes,
                m.manifest.topology.d2d,
            )
            accepted = self._engine.accept(index, m, m.kernel, m.kv, job, resolved, bank, fault, durations)
            return CalsimSubmission(self._engine, accepted, m.manifest.timing.d2h_gbps)

    def counters(self) -> JobCounters:
        with self._cond:
            self._engine.ensure_alive()
            return self._engine.counters()

    # ------------------------------------------------------------------ faults and resets

    def inject(self, fault: Fault) -> Fault:
        """Add a fault at run time (the InjectFault ops RPC). A fault with neither `job` nor
        `probability` fires at the next submit attempt.

        Returns:
            The planned fault, its `job` index filled in.

        Raises:
            InvalidJob: the index is past or taken, or probabilities would exceed 1.
            DeviceLost: the device was lost or closed.
        """
        with self._cond:
            self._engine.ensure_alive()
            return self._plan.inject(fault, self._attempts)

    def clear_faults(self) -> None:
        """Remove every planned fault (the InjectFault RPC's clear_existing).

        Raises:
            DeviceLost: the device was lost or closed.
        """
        with self._cond:
            self._engine.ensure_alive()
            self._plan.clear()

    def full_row_reads(self) -> int:
        """Rows of top-k jobs whose full logits were read on demand since open (calsim only)."""
        with self._cond:
            return self._engine.row_reads

    def next_job_index(self) -> int:
        """The index the next submit attempt gets (counts refused attempts too, unlike
        `counters().submitted`)."""
        with self._cond:
            return self._attempts

    def fault_plan(self) -> dict[str, Any]:
        """The faults still planned, in the plan's JSON form (calsim only). An index fault whose
        submit attempt has come (it fired, or the attempt was refused) is spent and left out."""
        with self._cond:
            plan = self._plan.to_dict()
            plan["faults"] = [f for f in plan["faults"] if f.get("job", self._attempts) >= self._attempts]
            return plan

    def reset_ccu(self) -> None:
        with self._cond:
            self._engine.ensure_alive()
            self._engine.reset_ccu()

    def open_lane(self, model: ConfiguredModel, lane: int) -> None:
        """See `VirtualDevice.open_lane`. calsim's lanes need no allocation: it checks the handle and
        the lane, and refuses to open a lane twice (a daemon bug a real KV Apply would not catch)."""
        with self._cond:
            self._engine.ensure_alive()
            m = self._lane_of(model, lane)
            opened = self._open_lanes.setdefault(m.config_id, set())
            if lane in opened:
                raise InvalidJob(f"KV lane {lane} of {m.name!r} is already open")
            opened.add(lane)

    def close_lane(self, model: ConfiguredModel, lane: int) -> None:
        """See `VirtualDevice.close_lane`. KV Free poisons the lane: its KV is overwritten with
        garbage and its valid length drops to 0, so a daemon that still trusts it gets StaleKV (or,
        with a stale past_kv_len of 0 and old tokens, different logits), never the old answer."""
        with self._cond:
            self._engine.ensure_alive()
            m = self._lane_of(model, lane)
            opened = self._open_lanes.get(m.config_id, set())
            if lane not in opened:
                raise InvalidJob(f"KV lane {lane} of {m.name!r} is not open")
            self._engine.wait_kernel_idle()  # the worker may be inside a kernel call on other lanes
            self._own(m)  # released while we waited?
            opened.discard(lane)
            m.kernel.corrupt_lane(lane, np.random.default_rng([self._plan.seed, m.config_id, lane, 0xF4EE]))
            m.kv.lost((lane,))

    def _lane_of(self, model: ConfiguredModel, lane: int) -> CalsimModel:
        """Raises: ModelReleased (stale handle), InvalidJob (lane out of range)."""
        m = self._own(model)
        if isinstance(lane, bool) or not isinstance(lane, int) or not 0 <= lane < m.lanes:
            raise InvalidJob(f"KV lane {lane!r} out of range 0..{m.lanes - 1} of {m.name!r}")
        return m

    def reset_configuration(self, model: ConfiguredModel) -> None:
        """See `VirtualDevice.reset_configuration`. As CalRT 0.7.6 does, the reset drops every
        configured calbin, not only `model`'s: each model's in-flight jobs end CCU_EXCEPTION, its
        lanes are gone with it, its memory is free, and its handle raises ModelReleased from now on."""
        with self._cond:
            self._engine.ensure_alive()
            self._own(model)
            self._engine.wait_kernel_idle()
            self._own(model)  # it may have been released while we waited
            for m in list(self._models.values()):
                self._engine.reset_model(m.config_id, m.kernel, m.kv)
                m.state.move(ConfigState.RELEASED)
                del self._models[m.config_id]
                self._open_lanes.pop(m.config_id, None)
                self._memory.release(m.config_id)
            self._memory.clear_leaks()

    def close(self) -> None:
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._closing.set()
            self._engine.shutdown(self._engine.gone or f"calsim board {self._info.board_index} is closed")
            for m in list(self._models.values()):
                m.state.move(ConfigState.RELEASED)
                self._memory.release(m.config_id)
            self._models.clear()
            self._buffers.clear()
        self._engine.join()
        if self._release_hold is not None:
            self._release_hold()  # another process may open the board now


class CalsimDriver(DeviceDriver):
    """Entry point `calsim` of group `calculet.devices`. Every board index >= 0 exists: each open
    creates an independent emulated board. One process at a time may hold a board (`device_lock`);
    opens within that process share the hold."""

    name = "calsim"

    def open(self, board: int, options: Mapping[str, Any]) -> CalsimDevice:
        """See `DeviceDriver.open`; options are listed in `calculet.daemon.calsim.options`."""
        if isinstance(board, bool) or not isinstance(board, int) or board < 0:
            raise DeviceNotFound(f"calsim has no board {board!r} (board indexes are integers >= 0)")
        if not isinstance(options, Mapping):
            raise InvalidJob(f"calsim options must be a mapping, got {type(options).__name__}")
        parsed = parse_options(options)
        hold = hold_board(state_dir(parsed.state_dir, os.environ), board)
        try:
            return CalsimDevice(board, parsed, hold)
        except BaseException:
            hold.release()
            raise


__all__ = ["CalsimDevice", "CalsimDriver", "CalsimModel", "CalsimSubmission"]
