"""Which thread launches the next device job (`EngineConfig.launch_from_completion`, `engine.py`):
by default the completion thread submits each decode step right after settling the one before,
and the engine thread only launches what arrives otherwise (a new request's prefill). Off, the
engine thread launches everything. Either way the tokens are the same, batched or not, and the
board ends clean."""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path

import pytest

from calculet.daemon.calsim.device import CalsimDevice
from calculet.daemon.calsim.handles import CalsimSubmission
from calculet.daemon.calsim.options import parse_options
from calculet.daemon.core.config import DaemonConfig
from calculet.daemon.core.device_core import DeviceCore
from calculet.daemon.core.engine_types import EngineConfig
from calculet.daemon.device.api import ConfiguredModel
from calculet.daemon.device.types import EngineSlot, JobSpec
from calculet.ops.sim_packages.build import build_sim_package

from .engine_factories import assert_clean, finish, request

TOKENS = 12


class ThreadRecordingDevice(CalsimDevice):
    """calsim (time scale 0) that records, per submit, the job's submodel and the submitting thread."""

    def __init__(self) -> None:
        super().__init__(0, parse_options({"time_scale": 0.0, "profile": "calsim-dev"}))
        self.launches: list[tuple[str, str]] = []

    def submit(
        self, model: ConfiguredModel, job: JobSpec, engine_slot: EngineSlot = EngineSlot.AUTO
    ) -> CalsimSubmission:
        self.launches.append((job.submodel, threading.current_thread().name))
        return super().submit(model, job, engine_slot)


def serve(root: Path, monkeypatch: pytest.MonkeyPatch, *, from_completion: bool) -> tuple[list[list[int]], list]:  # type: ignore[type-arg]
    """Six requests at once on the tiny package: their tokens and the device's launches."""
    original = DaemonConfig.engine_config

    def engine_config(self: DaemonConfig) -> EngineConfig:
        return dataclasses.replace(original(self), launch_from_completion=from_completion)

    monkeypatch.setattr(DaemonConfig, "engine_config", engine_config)
    device = ThreadRecordingDevice()
    core = DeviceCore(DaemonConfig(models_root=root, models=(("tiny", "tiny"),)), device=device)
    core.start()
    try:
        device.launches.clear()  # the warm-up's
        ids = [core.submit(request((5 + i, 6, 7), TOKENS, seed=i, temperature=0.9)).job_id for i in range(6)]
        tokens = [finish(core, job_id)[0] for job_id in ids]
        assert_clean(core)
        return tokens, list(device.launches)
    finally:
        core.close()


def test_the_completion_thread_launches_decode_steps_and_the_tokens_do_not_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    build_sim_package("tiny", tmp_path / "tiny")
    by_completion, launches = serve(tmp_path, monkeypatch, from_completion=True)
    by_engine, engine_launches = serve(tmp_path, monkeypatch, from_completion=False)
    assert by_completion == by_engine and all(len(t) == TOKENS for t in by_completion)

    assert {name for _, name in engine_launches} == {"calculet-engine"}
    decodes = [name for submodel, name in launches if "decode" in submodel]
    assert len(decodes) >= TOKENS - 1
    # A decode step follows the settlement of the step before it, on the completion thread; the
    # engine thread launches one only when no settlement precedes it (after a prefill it launched,
    # when the completion thread found the bank busy, or a plan not yet ready).
    assert decodes.count("calculet-completion") >= len(decodes) // 2, launches
    assert {name for _, name in launches} <= {"calculet-engine", "calculet-completion"}
