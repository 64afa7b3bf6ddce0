"""`calctl capacity --package DIR --daemon T`: the board's measured memory of that package (models
whose package hash is the manifest's) beside the plan, from a fake daemon's Status; a model of
another package is left out; `--daemon` without `--package` is a usage error."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from calculet.daemon.package.manifest import MANIFEST_NAME
from calculet.v1 import observe_pb2
from tests.unit.client import fake_daemon
from tests.unit.client.fake_daemon import FakeDaemon, status_response
from tests.unit.package.conftest import PackageFactory

from .calctl_fakes import calctl, served, usage_error


def test_the_boards_measured_figures_sit_beside_the_plan(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = PackageFactory(tmp_path).write()
    digest = hashlib.sha256((package / MANIFEST_NAME).read_bytes()).hexdigest()

    def respond(fake: FakeDaemon) -> observe_pb2.StatusResponse:
        status = status_response(fake)
        ours = status.models[0]
        ours.package_hash = digest
        ours.memory.add(chip=0, planned_dram_bytes=5_000, planned_sram_bytes=7, dram_bytes=5_100, sram_bytes=7,
                        measured=True)  # fmt: skip
        other = status.models.add(alias="other", generation=9, package_hash="ab" * 32)
        other.memory.add(chip=0, planned_dram_bytes=1, dram_bytes=1, measured=True)
        return status

    monkeypatch.setattr(fake_daemon, "status_response", respond)
    with served(FakeDaemon(), tmp_path / "b.sock") as target:
        code, out, _ = calctl(capsys, "capacity", "--package", str(package), "--daemon", target, "--json")
        assert code == 0
        measured = json.loads(out)["measured"]
        assert [m["alias"] for m in measured] == ["tiny"]
        assert measured[0]["chips"] == [
            {"chip": 0, "planned_dram_bytes": 5_000, "planned_sram_bytes": 7, "dram_bytes": 5_100, "sram_bytes": 7}
        ]
        code, out, _ = calctl(capsys, "capacity", "--package", str(package), "--daemon", target)
        assert code == 0 and "model memory per chip" in out and "+0.0" in out  # 100 B is +0.0 MiB
    code, out, _ = calctl(capsys, "capacity", "--package", str(package), "--json")
    assert code == 0 and "measured" not in json.loads(out)  # no --daemon: the plan alone


def test_daemon_without_package_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert "--daemon goes with --package" in usage_error(capsys, "capacity", "--preset", "tiny", "--daemon", "unix:x")
