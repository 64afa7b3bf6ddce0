"""The compatibility matrix: which rows cover a device, and when two calbins may share a board."""

from __future__ import annotations

from dataclasses import replace

import pytest

from calculet.daemon.package.capacity import DeviceLimits
from calculet.daemon.package.compat import co_residency_refusal, matrix_rows
from calculet.daemon.package.manifest import CompatRow, PackageManifest

from .conftest import valid_manifest

ROW_076 = CompatRow(runtime=">=0.7.6,<0.8", driver=">=0.7.6,<1.0", firmware="*", co_resident=False)
ROW_100 = CompatRow(runtime=">=0.7.6,<0.8", driver=">=1.0.0,<1.1", firmware=">=1.0.0,<1.1", co_resident=True)


def with_matrix(*rows: CompatRow) -> PackageManifest:
    m = valid_manifest()
    return replace(m, compatibility=replace(m.compatibility, matrix=rows))


def device(driver: str | None, firmware: str | None = "1.0.0") -> DeviceLimits:
    return DeviceLimits(runtime_version="0.7.6", driver_version=driver, firmware_version=firmware)


def test_rows_cover_a_device_by_all_three_versions() -> None:
    m = with_matrix(ROW_076, ROW_100)
    assert matrix_rows(m, device("0.7.6")) == [ROW_076]
    assert matrix_rows(m, device("1.0.0")) == [ROW_100]
    assert matrix_rows(m, device("1.0.0", firmware="0.9.0")) == []  # firmware outside the 1.0 row
    assert matrix_rows(m, device("1.0.0", firmware=None)) == [ROW_100]  # a version not reported is not checked
    assert matrix_rows(m, device("1.2.0")) == []


def test_a_malformed_row_never_matches() -> None:
    assert matrix_rows(with_matrix(replace(ROW_100, driver="1.0")), device("1.0.0")) == []


@pytest.mark.parametrize(
    ("manifest", "limits", "reason"),
    [
        (with_matrix(ROW_076, ROW_100), device("0.7.6"), "driver 0.7.6 holds one configured calbin"),
        (with_matrix(ROW_076, ROW_100), device(None), "driver unknown holds one configured calbin"),
        (with_matrix(), device("1.0.0"), "declares no compatibility matrix"),
        (with_matrix(replace(ROW_100, co_resident=False)), device("1.0.0"), "allows no co-residency on runtime 0.7.6"),
        (with_matrix(ROW_100), device("1.0.0", firmware="2.0.0"), "allows no co-residency"),
    ],
)
def test_co_residency_is_refused_with_its_reason(manifest: PackageManifest, limits: DeviceLimits, reason: str) -> None:
    refusal = co_residency_refusal(manifest, limits)
    assert refusal is not None and reason in refusal


def test_driver_1_0_0_and_a_row_that_says_so_allow_it() -> None:
    assert co_residency_refusal(with_matrix(ROW_076, ROW_100), device("1.0.0")) is None
