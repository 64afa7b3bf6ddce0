"""The distribution: a wheel built from the tree holds every package, the package data the code
reads at run time, and the console scripts; the entry points resolve."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from importlib.metadata import entry_points
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    out = tmp_path_factory.mktemp("wheel")
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(REPO)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=300)
    (path,) = out.glob("calculet-*.whl")
    return zipfile.ZipFile(path)


def test_wheel_maps_every_folder_into_the_calculet_namespace(wheel: zipfile.ZipFile) -> None:
    names = set(wheel.namelist())
    pairs = [("common", "common"), ("daemon", "daemon"), ("client", "client"), ("ops", "ops"), ("gateway", "gateway")]
    for folder, package in pairs:
        for init in (REPO / folder).rglob("__init__.py"):
            rel = init.relative_to(REPO / folder).as_posix()
            assert f"calculet/{package}/{rel}" in names, f"{init} missing from the wheel"
    assert "calculet/v1/daemon_pb2_grpc.py" in names
    assert "calculet/v1/daemon.proto" in names
    assert "calculet/ops/sim_packages/chat_template.j2" in names, "package data read at build-sim time"
    bare = ("common/", "daemon/", "client/", "ops/", "tests/")
    assert not any(n.startswith(bare) for n in names), "bare top-level names"


def test_wheel_declares_console_scripts_and_the_calsim_driver(wheel: zipfile.ZipFile) -> None:
    ep = next(n for n in wheel.namelist() if n.endswith("entry_points.txt"))
    text = wheel.read(ep).decode()
    for script in ("calculet-daemon = calculet.daemon.main:main", "calctl = calculet.ops.calctl:main",
                   "calculet-gateway = calculet.gateway.main:main",
                   "calsim = calculet.daemon.calsim.device:CalsimDriver"):  # fmt: skip
        assert script in text


def test_installed_entry_points_resolve() -> None:
    for ep in entry_points(group="console_scripts"):
        if ep.value.startswith("calculet."):
            assert callable(ep.load())
    (calsim,) = [ep for ep in entry_points(group="calculet.devices") if ep.name == "calsim"]
    assert calsim.load().__name__ == "CalsimDriver"
