"""The Load stream's byte counts through the real servicer (`ServedCore`): while VALIDATING the daemon
reports the package files it hashes, from 0 to the manifest's total (bytes_done == bytes_total at
the end of the phase); the phases without a byte measure carry 0/0; an invalid package still counts
its bytes before it FAILS."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from calculet.daemon.core.config import DaemonConfig
from calculet.daemon.core.device_core import DeviceCore
from calculet.daemon.package.manifest import load_manifest
from calculet.ops.sim_packages.build import build_sim_package
from calculet.v1 import common_pb2, operate_pb2

from .served_core import CALL_S, ServedCore

M = common_pb2


@pytest.fixture(scope="module")
def models_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("models")
    build_sim_package("tiny", root / "tiny")
    shutil.copytree(root / "tiny", root / "flipped")
    blob = root / "flipped" / "param_blk0.bin"
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF
    blob.write_bytes(bytes(data))
    return root


@pytest.fixture(scope="module")
def served(models_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedCore]:
    config = DaemonConfig(models_root=models_root, device_options={"time_scale": 0.0, "profile": "calsim-dev"})
    core = DeviceCore(config)
    core.start()
    board = ServedCore(core, tmp_path_factory.mktemp("sock") / "d.sock")
    yield board
    board.close()


def _load(served: ServedCore, alias: str, package: str) -> list[operate_pb2.LoadProgress]:
    request = operate_pb2.LoadRequest(alias=alias, package=package)
    return list(served.stub.Load(request, timeout=CALL_S))


def _total(models_root: Path) -> int:
    return sum(f.size for f in load_manifest(models_root / "tiny").files)


def test_validating_carries_the_bytes_hashed_up_to_the_total(served: ServedCore, models_root: Path) -> None:
    stream = _load(served, "bytes", "tiny")
    total = _total(models_root)
    try:
        assert stream[-1].done and stream[-1].state == M.MODEL_STATE_READY, stream[-1]
        counted = [p for p in stream if p.bytes_total]
        assert counted and all(p.state == M.MODEL_STATE_VALIDATING and p.bytes_total == total for p in counted)
        assert counted[0].bytes_done == 0 and counted[-1].bytes_done == total > 0
        done = [p.bytes_done for p in counted]
        assert done == sorted(done)
        assert counted[-1].message.startswith("validated tiny")  # the phase closes with its full count
        others = [p for p in stream if p.state != M.MODEL_STATE_VALIDATING]
        assert {p.state for p in others} >= {M.MODEL_STATE_CONFIGURING, M.MODEL_STATE_WARMING}
        assert all((p.bytes_done, p.bytes_total) == (0, 0) for p in others)
    finally:
        served.stub.Unload(operate_pb2.UnloadRequest(alias="bytes"), timeout=CALL_S)


def test_an_invalid_package_counts_its_bytes_then_fails(served: ServedCore, models_root: Path) -> None:
    stream = _load(served, "flipped", "flipped")
    total = _total(models_root)
    last = stream[-1]
    assert last.done and last.state == M.MODEL_STATE_FAILED and "file.hash" in last.error.message, last
    assert (last.bytes_done, last.bytes_total) == (0, 0)
    validating = stream[:-1]
    assert validating and all(p.state == M.MODEL_STATE_VALIDATING for p in validating)
    assert (validating[0].bytes_done, validating[-1].bytes_done) == (0, total)
