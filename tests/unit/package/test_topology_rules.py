"""`topology.parallelism` and `topology.d2d`: every named form is clean where it belongs, the D2D
declaration round-trips (and is absent when undeclared), and a built-in preset says `tp` or `none`.
The defects themselves (one code each) are cases of test_validate.py's table."""

from __future__ import annotations

from dataclasses import replace

import pytest

from calculet.daemon.package.manifest import (
    DEFAULT_D2D_LINK_GBPS,
    PARALLELISMS,
    D2DDecl,
    PackageManifest,
)
from calculet.daemon.package.presets import PRESETS
from calculet.daemon.package.validate import validate_package

from .conftest import PackageFactory, valid_manifest


@pytest.mark.parametrize("form", PARALLELISMS)
def test_every_named_form_is_clean_on_two_chips(factory: PackageFactory, form: str) -> None:
    m = valid_manifest()
    report = validate_package(factory.write(replace(m, topology=replace(m.topology, parallelism=form))))
    assert report.ok and not report.problems, report.render_text()


def test_d2d_round_trips_with_its_defaults_and_validates(factory: PackageFactory) -> None:
    m = valid_manifest()
    declared = replace(m, topology=replace(m.topology, d2d=D2DDecl(393_216, syncs_per_job=146)))
    raw = declared.to_dict()
    assert raw["topology"]["d2d"] == {
        "bytes_per_token": 393_216,
        "syncs_per_job": 146,
        "link_gbps": DEFAULT_D2D_LINK_GBPS,
        "sync_us": 10.0,
    }
    del raw["topology"]["d2d"]["link_gbps"]  # optional: a package may leave the link to the default
    assert PackageManifest.from_dict(raw).topology.d2d == D2DDecl(393_216, 146)
    report = validate_package(factory.write(declared))
    assert report.ok and not report.problems, report.render_text()


def test_undeclared_d2d_is_absent_from_the_manifest() -> None:
    raw = valid_manifest().to_dict()
    assert "d2d" not in raw["topology"]
    assert PackageManifest.from_dict(raw).topology.d2d is None


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_say_tp_on_two_chips_and_none_on_one(name: str) -> None:
    t = PRESETS[name].topology
    assert t.parallelism == ("tp" if t.chips == 2 else "none")
