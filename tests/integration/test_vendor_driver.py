"""A driver the daemon has never heard of, found through the `calculet.devices` entry points with no
daemon change (issue 9): a stand-in vendor binding (a calsim subclass with a kernel kind of its own,
installed as a distribution on PYTHONPATH) serves a package of its kind with exactly calsim's tokens,
and the package validator checks kernel kinds against the loaded driver, not a fixed list."""

from __future__ import annotations

import json
import shutil
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from calculet.client import DaemonClient, FailedPrecondition

from .conftest import DaemonProcess

STUB_MODULE = '''
"""A stand-in vendor binding: calsim under another name, configuring the kernel kind "stub-numeric"."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from calculet.daemon.calsim.device import CalsimDevice, CalsimDriver
from calculet.daemon.calsim.kernel import make_kernel
from calculet.daemon.calsim.options import parse_options
from calculet.daemon.device.types import DeviceInfo

KIND = "stub-numeric"


def _kernel(manifest, package_dir: Path, lanes: int, lane_context: int):
    return make_kernel(dataclasses.replace(manifest, kernel="numeric"), package_dir, lanes, lane_context)


class StubDevice(CalsimDevice):
    def info(self) -> DeviceInfo:
        info = super().info()
        caps = dataclasses.replace(info.capabilities, kernel_kinds=(KIND,))
        return dataclasses.replace(info, name="stub", capabilities=caps)


class StubDriver(CalsimDriver):
    name = "stub"

    def open(self, board: int, options: Mapping[str, Any]) -> StubDevice:
        return StubDevice(board, parse_options({**options, "kernel_factory": _kernel}))
'''


@pytest.fixture
def stub_site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A directory holding the stub binding and its distribution metadata, put on PYTHONPATH."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "stub_binding.py").write_text(textwrap.dedent(STUB_MODULE), encoding="utf-8")
    dist = site / "stub_binding-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: stub-binding\nVersion: 0.1\n", encoding="utf-8")
    (dist / "entry_points.txt").write_text("[calculet.devices]\nstub = stub_binding:StubDriver\n", encoding="utf-8")
    monkeypatch.setenv("PYTHONPATH", str(site))
    return site


@pytest.fixture
def stub_models(models_root: Path, tmp_path: Path) -> Path:
    """The models root plus `tiny-stub`: tiny's package declaring the stub's kernel kind."""
    root = tmp_path / "models"
    shutil.copytree(models_root, root)
    shutil.copytree(root / "tiny", root / "tiny-stub")
    manifest_path = root / "tiny-stub" / "calculet-package.json"
    manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    manifest["kernel"] = "stub-numeric"
    manifest_path.write_text(json.dumps(manifest), encoding="utf-8")
    return root


def _tokens(target: str, model: str) -> list[int]:
    with DaemonClient(target) as client:
        return list(client.generate(model, [5, 6, 7, 8], max_tokens=24, temperature=0.9, seed=11, ignore_eos=True))


def test_a_driver_from_another_distribution_serves_with_no_daemon_change(
    stub_site: Path, stub_models: Path, start_daemon: Callable[..., DaemonProcess]
) -> None:
    calsim = start_daemon("--model", "tiny=tiny")
    stub = start_daemon("--device", "stub", "--models-root", str(stub_models), "--model", "tiny=tiny-stub")
    assert _tokens(stub.target, "tiny") == _tokens(calsim.target, "tiny"), "the stub runs calsim's numeric kernel"
    with DaemonClient(stub.target) as client:
        assert client.status().device.name == "stub"
        with pytest.raises(FailedPrecondition, match=r"kernel\.unknown"):  # the stub does not configure "numeric"
            client.load_and_wait("plain", "tiny")


def test_calsim_refuses_a_package_of_a_kernel_kind_it_does_not_configure(
    stub_models: Path, start_daemon: Callable[..., DaemonProcess]
) -> None:
    calsim = start_daemon("--models-root", str(stub_models), "--model", "tiny=tiny")
    with DaemonClient(calsim.target) as client, pytest.raises(FailedPrecondition, match=r"kernel\.unknown"):
        client.load_and_wait("stubbed", "tiny-stub")
