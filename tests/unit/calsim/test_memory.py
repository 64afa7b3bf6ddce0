"""Per-chip memory: need = params + workspace + KV share (DRAM) and params (SRAM); refused
configures change nothing; release gives memory back; the resident-configuration limit."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from calculet.daemon.calsim.memory import GiB, MemoryMap, MiB, chip_needs
from calculet.daemon.device.errors import (
    BufferInUse,
    ConfigurationError,
    ModelReleased,
    OutOfDeviceMemory,
    TooManyConfigurations,
)
from calculet.daemon.package.manifest import ChipMemoryDecl, MemoryDecl, Topology

from .conftest import OpenDevice
from .factories import (
    DECODE1,
    PARAM_DRAM,
    PARAM_SRAM,
    WORKSPACE,
    Gate,
    KernelBox,
    decode_spec,
    kernel_of,
    make_bufs,
    make_manifest,
    need_dram_per_chip,
    single_chip_manifest,
)


def test_need_is_params_workspace_and_an_even_kv_share() -> None:
    manifest = make_manifest()
    needs = chip_needs(manifest, 2)
    kv = manifest.kv
    for need, decl in zip(needs, manifest.memory.chips, strict=True):
        assert need.kv * 2 == kv.bytes_per_token * kv.lanes * kv.lane_context
        assert need.dram == decl.param_dram_bytes + decl.workspace_bytes + need.kv
        assert need.sram == decl.param_sram_bytes


@given(st.integers(1, 10**6), st.integers(1, 64), st.integers(1, 4096))
def test_kv_share_covers_the_whole_kv_over_two_chips(bpt: int, lanes: int, ctx: int) -> None:
    manifest = make_manifest()
    manifest = replace(manifest, kv=replace(manifest.kv, bytes_per_token=bpt, lanes=lanes, lane_context=ctx))
    share = chip_needs(manifest, 2)[0].kv
    assert 2 * share >= bpt * lanes * ctx > 2 * (share - 1)


def test_chip_needs_refuses_a_package_for_other_chips() -> None:
    three = make_manifest(topology=Topology(3, (1, 2, 4), "tp"))
    with pytest.raises(ConfigurationError, match="built for 3 chips; this board has 2"):
        chip_needs(three, 2)
    one_chip_plan = replace(make_manifest().memory, chips=make_manifest().memory.chips[:1])
    with pytest.raises(ConfigurationError, match="expected 2 distinct chip"):
        chip_needs(make_manifest(memory=one_chip_plan), 2)
    with pytest.raises(ConfigurationError, match="matching the masks"):  # plan on chip 1, mask names chip 0
        chip_needs(replace(single_chip_manifest(chip=1), topology=Topology(1, (1,), "none")), 2)
    with pytest.raises(ConfigurationError, match=r"of 0\.\.1"):  # a chip the board lacks
        chip_needs(single_chip_manifest(chip=2), 2)
    negative = MemoryDecl((ChipMemoryDecl(0, 1, -1, 0, 0), ChipMemoryDecl(1, 2, 0, 0, 0)), 0)
    with pytest.raises(ConfigurationError, match="negative"):
        chip_needs(make_manifest(memory=negative), 2)


@pytest.mark.parametrize("chip", [0, 1])
def test_a_single_chip_package_needs_its_chip_only_with_the_whole_kv(chip: int) -> None:
    manifest = single_chip_manifest(chip=chip)
    (need,) = chip_needs(manifest, 2)
    kv = manifest.kv
    assert need.chip == chip
    assert need.kv == kv.bytes_per_token * kv.lanes * kv.lane_context
    assert need.dram == PARAM_DRAM + WORKSPACE + need.kv and need.sram == PARAM_SRAM


def test_single_chip_models_take_one_chip_each_and_leave_the_other_free(
    open_device: OpenDevice, tmp_path: Path
) -> None:
    need = PARAM_DRAM + WORKSPACE + chip_needs(single_chip_manifest(), 2)[0].kv
    device = open_device(dram_bytes=need + need // 2)  # one such model per chip, never two
    on_one = device.configure(tmp_path, single_chip_manifest("b", chip=1))
    assert [c.dram_used for c in device.memory_usage().chips] == [0, need]
    with pytest.raises(OutOfDeviceMemory, match="chip 1 needs"):
        device.configure(tmp_path, single_chip_manifest("c", chip=1))
    device.configure(tmp_path, single_chip_manifest("a", chip=0))
    assert [c.dram_used for c in device.memory_usage().chips] == [need, need]
    device.release(on_one)
    assert [c.dram_used for c in device.memory_usage().chips] == [need, 0]
    with pytest.raises(OutOfDeviceMemory, match="chip 0 needs"):  # a dual-chip model needs both chips
        device.configure(tmp_path, make_manifest("ab"))


def test_memory_map_reserve_is_all_or_nothing() -> None:
    mem = MemoryMap(2, dram_bytes=1000, sram_bytes=100)
    fits = chip_needs(make_manifest(), 2)
    small = tuple(replace(n, dram=400, sram=10) for n in fits)
    mem.reserve(1, small, "a")
    lopsided = (replace(fits[0], dram=500, sram=10), replace(fits[1], dram=700, sram=10))
    before = mem.usage()
    with pytest.raises(OutOfDeviceMemory, match="chip 1 needs 700 B DRAM"):
        mem.reserve(2, lopsided, "b")
    assert mem.usage() == before
    mem.release(1)
    assert all(c.dram_used == 0 and c.sram_used == 0 for c in mem.usage().chips)


def test_device_reports_usage_and_release_gives_it_back(open_device: OpenDevice, tmp_path: Path) -> None:
    device = open_device()
    empty = device.memory_usage()
    assert [(c.dram_used, c.sram_used) for c in empty.chips] == [(0, 0), (0, 0)]
    assert all(c.dram_total == 16 * GiB and c.sram_total == 18 * MiB for c in empty.chips)
    first = device.configure(tmp_path, make_manifest("a"))
    second = device.configure(tmp_path, make_manifest("b"))
    used = device.memory_usage()
    assert [c.dram_used for c in used.chips] == [2 * need_dram_per_chip(make_manifest())] * 2
    assert [c.sram_used for c in used.chips] == [2 * PARAM_SRAM] * 2
    device.release(first)
    assert [c.dram_used for c in device.memory_usage().chips] == [need_dram_per_chip(make_manifest())] * 2
    device.release(second)
    assert device.memory_usage() == empty


def test_out_of_dram_names_the_chip_and_numbers_and_changes_nothing(
    open_device: OpenDevice, tmp_path: Path, kernels: KernelBox
) -> None:
    need = need_dram_per_chip(make_manifest())
    device = open_device(dram_bytes=need + need // 2)
    device.configure(tmp_path, make_manifest("a"))
    before = device.memory_usage()
    with pytest.raises(OutOfDeviceMemory) as info:
        device.configure(tmp_path, make_manifest("b"))
    msg = str(info.value)
    assert "chip 0" in msg and f"needs {need} B DRAM" in msg and f"has {need // 2} B free of {need + need // 2}" in msg
    assert device.memory_usage() == before
    assert len(kernels.built) == 1  # no kernel was built for the refused package


def test_out_of_sram_is_refused(open_device: OpenDevice, tmp_path: Path) -> None:
    device = open_device(sram_bytes=PARAM_SRAM - 1)
    with pytest.raises(OutOfDeviceMemory, match=f"chip 0 needs {PARAM_SRAM} B SRAM but has {PARAM_SRAM - 1} B free"):
        device.configure(tmp_path, make_manifest())
    assert all(c.sram_used == 0 for c in device.memory_usage().chips)


def test_resident_limit(open_device: OpenDevice, tmp_path: Path) -> None:
    device = open_device(max_resident_configurations=1)
    assert device.info().capabilities.max_resident_configurations == 1
    first = device.configure(tmp_path, make_manifest("a"))
    with pytest.raises(TooManyConfigurations, match="limit is 1"):
        device.configure(tmp_path, make_manifest("b"))
    device.release(first)
    device.configure(tmp_path, make_manifest("b"))


def test_failed_kernel_build_returns_the_reservation(
    open_device: OpenDevice, tmp_path: Path, kernels: KernelBox
) -> None:
    device = open_device()
    kernels.fail_with = ValueError("weights missing")
    with pytest.raises(ConfigurationError, match="weights missing"):
        device.configure(tmp_path, make_manifest())
    assert all(c.dram_used == 0 for c in device.memory_usage().chips)
    kernels.fail_with = None
    device.configure(tmp_path, make_manifest())


def test_release_refuses_a_model_with_a_job_in_flight_and_stale_handles(
    open_device: OpenDevice, tmp_path: Path
) -> None:
    device = open_device()
    model = device.configure(tmp_path, make_manifest())
    bufs = make_bufs(device, model, DECODE1)
    gate = Gate()
    kernel_of(model).gate = gate
    sub = device.submit(model, decode_spec(bufs, [(0, 0, 1)]))
    assert gate.entered.wait(5)
    with pytest.raises(BufferInUse, match="in flight"):
        device.release(model)
    gate.open()
    sub.wait(5)
    device.release(model)
    with pytest.raises(ModelReleased):
        device.release(model)
    with pytest.raises(ModelReleased):
        device.submit(model, decode_spec(bufs, [(0, 0, 1)]))
    with pytest.raises(ModelReleased):
        device.reset_configuration(model)
