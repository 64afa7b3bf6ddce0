"""Profiles and the driver gate, the modelled switch cost, and the release-leak fault option."""

from __future__ import annotations

from pathlib import Path

import pytest

from calculet.daemon.calsim.memory import chip_needs
from calculet.daemon.calsim.switch_cost import (
    CONFIGURE_FIXED_S,
    DEPLOY_PER_SUBMODEL_S,
    KV_CLEAR_GBPS,
    PHASES,
)
from calculet.daemon.device.errors import InvalidJob, TooManyConfigurations

from .conftest import OpenDevice
from .factories import PARAM_DRAM, PARAM_SRAM, make_manifest, single_chip_manifest


@pytest.mark.parametrize(
    ("profile", "options", "driver", "resident"),
    [
        ("calrt-0.7.6", {}, "0.7.6-calsim", 1),
        ("calrt-1.0.0", {}, "1.0.0-calsim", 2),
        ("calrt-1.0.0", {"driver_version": "0.9.9"}, "0.9.9", 1),  # an older driver holds one calbin
        ("calrt-0.7.6", {"driver_version": "1.0.0"}, "1.0.0", 1),  # the profile's limit still holds
        ("calsim-dev", {}, "1.0.0-calsim", 2),
    ],
)
def test_the_driver_version_gates_two_resident_calbins(
    open_device: OpenDevice, tmp_path: Path, profile: str, options: dict[str, str], driver: str, resident: int
) -> None:
    device = open_device(profile=profile, **options)
    info = device.info()
    assert info.driver_version == driver and info.capabilities.max_resident_configurations == resident
    device.configure(tmp_path, single_chip_manifest("a", chip=0))
    if resident == 1:
        with pytest.raises(TooManyConfigurations, match=f"limit is 1 \\(profile {profile}, driver {driver}\\)"):
            device.configure(tmp_path, single_chip_manifest("b", chip=1))
    else:
        device.configure(tmp_path, single_chip_manifest("b", chip=1))


@pytest.mark.parametrize("bad", [1.0, "one", "", "1.0.0 ", "v1.0.0", 100])
def test_a_malformed_version_option_is_refused(open_device: OpenDevice, bad: object) -> None:
    with pytest.raises(InvalidJob, match="driver_version"):
        open_device(driver_version=bad)


def test_configure_reports_the_modelled_cost_of_each_phase(open_device: OpenDevice, tmp_path: Path) -> None:
    device = open_device()
    manifest = make_manifest()
    model = device.configure(tmp_path, manifest)
    needs = chip_needs(manifest, 2)
    kv_per_chip = manifest.kv.bytes_per_token * manifest.kv.lanes * manifest.kv.lane_context // 2
    assert tuple(model.configure_cost) == PHASES
    assert model.configure_cost["configure"] == CONFIGURE_FIXED_S
    assert model.configure_cost["upload"] == pytest.approx(
        2 * (PARAM_DRAM + PARAM_SRAM) / (manifest.timing.h2d_gbps * 1e9)
    )
    assert model.configure_cost["deploy"] == pytest.approx(DEPLOY_PER_SUBMODEL_S * len(manifest.submodels))
    assert model.configure_cost["kv_clear"] == pytest.approx(kv_per_chip / (KV_CLEAR_GBPS * 1e9))
    assert all(n.kv == kv_per_chip for n in needs)
    # one chip's model clears its whole KV on that chip: twice a dual-chip model's share
    solo = device.configure(tmp_path, single_chip_manifest())
    assert solo.configure_cost["kv_clear"] == pytest.approx(2 * model.configure_cost["kv_clear"])


def test_a_leaking_release_keeps_bytes_until_a_configuration_reset(open_device: OpenDevice, tmp_path: Path) -> None:
    device = open_device(release_leak_bytes=1000)
    empty = device.memory_usage()
    first = device.configure(tmp_path, single_chip_manifest("a", chip=1))
    device.release(first)
    assert [c.dram_used for c in device.memory_usage().chips] == [0, 1000]
    second = device.configure(tmp_path, make_manifest("b"))
    device.reset_configuration(second)  # frees every allocation, the leaked bytes too
    assert device.memory_usage() == empty
