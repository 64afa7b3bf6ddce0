"""Handles calsim gives out: `CalsimModel` (a configured package) and `CalsimSubmission` (a job).

Data flow: `CalsimDevice.configure` wraps the package's submodels, geometry and kernel in a
`CalsimModel`; `CalsimDevice.submit` wraps the accepted `Job` in a `CalsimSubmission`, whose
calls take the device's one lock (through the engine) to read the job's status and timestamps,
and whose `wait` blocks on the job's event outside the lock. Ownership: the model owns its
kernel (and so its KV lanes) until released; a submission observes its job, and its `wait` is
the one place the job's outputs reach the host buffers (`ComputeEngine.deliver`, when it returns
DONE): `status` reporting DONE is not enough, as with CalRT's OutputBuf status and Wait.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from enum import Enum
from pathlib import Path
from types import MappingProxyType

import numpy as np

from calculet.common.lifecycle import Lifecycle, table
from calculet.daemon.calsim.engine import ComputeEngine
from calculet.daemon.calsim.faults import Fault
from calculet.daemon.calsim.job import Job
from calculet.daemon.calsim.job_check import ModelGeometry
from calculet.daemon.calsim.kernel import Kernel
from calculet.daemon.calsim.lane_kv import LaneKV
from calculet.daemon.calsim.memory import ChipNeed
from calculet.daemon.device.api import ConfiguredModel, Submission
from calculet.daemon.device.errors import InvalidJob, WaitTimeout
from calculet.daemon.device.types import JobStatus, JobTimestamps, SubmodelInfo
from calculet.daemon.package.manifest import PackageManifest


class ConfigState(Enum):
    """State of one configuration (a package configured on the board) in calsim."""

    CONFIGURED = "configured"
    RELEASED = "released"


CONFIG_EDGES = table([(ConfigState.CONFIGURED, [ConfigState.RELEASED])])


class CalsimModel(ConfiguredModel):
    """A package configured on a calsim board. Owns its kernel (and so its KV lanes) until released.

    Attributes (beyond `ConfiguredModel`): owner (the device that configured it), manifest,
    package_dir, kernel, kv (valid KV length per lane), needs (bytes per chip), geometry (what job
    validation needs), state (CONFIGURED -> RELEASED), configure_cost (modelled seconds per phase).
    """

    def __init__(
        self,
        owner: object,
        config_id: int,
        manifest: PackageManifest,
        package_dir: Path,
        submodels: dict[str, SubmodelInfo],
        kernel: Kernel,
        needs: tuple[ChipNeed, ...],
        configure_cost: Mapping[str, float] = MappingProxyType({}),
    ) -> None:
        self.owner = owner
        self.configure_cost = configure_cost
        self.config_id = config_id
        self.name = manifest.name
        self.submodels = MappingProxyType(submodels)
        self.lanes = manifest.kv.lanes
        self.lane_context = manifest.kv.lane_context
        self.vocab_size = manifest.architecture.vocab_size
        self.manifest = manifest
        self.package_dir = package_dir
        self.kernel = kernel
        self.kv = LaneKV(self.lanes)  # valid KV length per lane: stale rows are refused (StaleKV)
        self.needs = needs
        contexts = {d.name: min(self.lane_context, d.context) for d in manifest.submodels}
        self.geometry = ModelGeometry(self.submodels, self.lanes, contexts)
        self.state: Lifecycle[ConfigState] = Lifecycle(
            f"calsim model {self.name} #{config_id}", ConfigState.CONFIGURED, CONFIG_EDGES
        )

    def __repr__(self) -> str:
        return f"CalsimModel({self.name!r}, config_id={self.config_id}, {self.state.state.name})"


class CalsimSubmission(Submission):
    """Handle of one accepted calsim job. `history()` and `fault` (calsim only) show the statuses
    it went through and the fault it carries, for tests and traces."""

    def __init__(self, engine: ComputeEngine, job: Job, d2h_gbps: float) -> None:
        self._engine = engine
        self._job = job
        self.job_id = job.job_id
        self.engine_slot = job.bank
        self.spec = job.spec
        self._d2h_gbps = d2h_gbps  # the package's declared D2H rate: what a row read takes

    @property
    def fault(self) -> Fault | None:
        return self._job.fault

    def status(self) -> JobStatus:
        """See `Submission.status`. DONE here does not put the outputs in the host buffers: only
        `wait` does."""
        with self._engine.cond:
            self._engine.ensure_alive()
            return self._job.status.state

    def wait(self, timeout: float | None = None) -> JobStatus:
        """See `Submission.wait`: returning DONE writes the job's outputs into its output buffers
        (they held poison since submit). Also raises InvalidJob for a negative or NaN timeout."""
        if timeout is not None and not timeout >= 0:
            raise InvalidJob(f"wait timeout must be >= 0 seconds or None, got {timeout!r}")
        with self._engine.cond:
            self._engine.ensure_alive()
        self._job.done.wait(timeout)
        with self._engine.cond:
            self._engine.ensure_alive()
            if not self._job.finished:
                raise WaitTimeout(f"job {self.job_id} not finished after {timeout} s; its buffers stay held")
            self._engine.observe_finished(self._job)
            self._engine.deliver(self._job)
            return self._job.status.state

    def timestamps(self) -> JobTimestamps | None:
        with self._engine.cond:
            self._engine.ensure_alive()
            return self._job.timestamps() if self._job.finished else None

    def read_logits_row(self, row: int, out: np.ndarray) -> None:
        """See `Submission.read_logits_row`: paced like every modelled step (outside the lock)."""
        with self._engine.cond:
            self._engine.ensure_alive()
            if not self._job.finished:
                raise InvalidJob(f"job {self.job_id} is not finished: its logits are not readable yet")
            wait = self._engine.read_logits_row(self._job, row, out, self._d2h_gbps)
        if wait > 0:
            time.sleep(wait)

    def history(self) -> tuple[JobStatus, ...]:
        with self._engine.cond:
            return tuple(self._job.history)

    def __repr__(self) -> str:
        return f"CalsimSubmission(job={self.job_id}, engine_slot={self.engine_slot.value})"
