"""Status gives each resident model's DRAM and SRAM per chip, the capacity planner's figure beside
the device's measured one, and the board's cross-chip (D2D) traffic, on the core's view, on the
wire and in the metrics; one in-process board serving a tiny package built as expert parallel."""

from __future__ import annotations

from pathlib import Path

from calculet.daemon.calsim.memory import chip_needs
from calculet.daemon.calsim.timing import d2d_bytes
from calculet.daemon.core.config import DaemonConfig
from calculet.daemon.core.device_core import DeviceCore
from calculet.daemon.core.observe.model_memory import model_memory
from calculet.daemon.device.types import RowSpec, TaskType
from calculet.daemon.package.capacity import MemoryModel, chip_plans
from calculet.daemon.package.manifest import load_manifest
from calculet.daemon.telemetry.status_gauges import GAUGES
from calculet.daemon.wire_views import status_to_pb
from calculet.ops.sim_packages import build_sim_package
from calculet.ops.sim_packages.parallelism import TRAFFIC
from tests.unit.calsim.factories import make_manifest


def test_status_reports_model_memory_per_chip_and_d2d_traffic(tmp_path: Path) -> None:
    package = build_sim_package("tiny", tmp_path / "tiny", parallelism="ep")
    manifest = load_manifest(package)
    assert manifest.topology.parallelism == "ep" and manifest.topology.d2d is not None
    config = DaemonConfig(models_root=tmp_path, models=(("tiny", "tiny"),), device_options={"time_scale": 0.0})
    core = DeviceCore(config)
    core.start()  # loads and warms the model: its golden probe runs device jobs
    try:
        view = core.status()
    finally:
        core.close()
    (model,) = view.models
    planned = chip_plans(MemoryModel.from_manifest(manifest), manifest.kv.lanes, manifest.kv.lane_context)
    device = chip_needs(manifest, 2)  # what calsim reserves: the device's own accounting
    assert [(c.chip, c.planned_dram, c.planned_sram) for c in model.memory] == [
        (p.chip, p.dram, p.sram) for p in planned
    ]
    assert [(c.chip, c.dram, c.sram, c.measured) for c in model.memory] == [
        (n.chip, n.dram, n.sram, True) for n in device
    ]
    assert all(c.dram > 0 for c in model.memory)
    u = view.utilization
    per_token, _ = TRAFFIC["ep"]
    probe = d2d_bytes(manifest.topology.d2d, TaskType.PREFILL, 1, [RowSpec(0, 0, len(manifest.golden.prompt_tokens))])
    assert u.d2d_bytes >= probe > 0 and u.d2d_bytes % per_token == 0
    assert 0 < u.d2d_seconds < u.compute_seconds

    pb = status_to_pb(view)
    assert [(c.chip, c.planned_dram_bytes, c.dram_bytes, c.measured) for c in pb.models[0].memory] == [
        (c.chip, c.planned_dram, c.dram, True) for c in model.memory
    ]
    assert (pb.utilization.d2d_bytes, pb.utilization.d2d_seconds) == (u.d2d_bytes, u.d2d_seconds)

    gauges = {g.name: list(g.read(view)) for g in GAUGES}
    memory = {(p[1]["chip"], p[1]["memory"], p[1]["source"]): p[0] for p in gauges["calculet_model_memory_bytes"]}
    assert memory[("0", "dram", "planned")] == model.memory[0].planned_dram
    assert memory[("1", "dram", "measured")] == model.memory[1].dram
    assert gauges["calculet_device_d2d_bytes_total"] == [(u.d2d_bytes, {})]


def test_before_configure_the_plan_stands_alone_and_an_untouched_chip_measures_zero() -> None:
    manifest = make_manifest()
    plans = chip_plans(MemoryModel.from_manifest(manifest), 2, 64)
    unmeasured = model_memory(manifest, 2, 64, None)
    assert [(c.chip, c.planned_dram, c.dram, c.measured) for c in unmeasured] == [
        (p.chip, p.dram, 0, False) for p in plans
    ]
    one_chip = model_memory(manifest, 2, 64, {0: (123, 4)})
    assert [(c.dram, c.sram, c.measured) for c in one_chip] == [(123, 4, True), (0, 0, True)]
    assert plans[0].dram < chip_plans(MemoryModel.from_manifest(manifest), 4, 64)[0].dram  # the KV layout counts
