"""`calctl bench compare` as a real process on two tiny packages built tensor parallel and expert
parallel: one one-board fleet each (2 daemon starts), the same 3 requests on both, the report side by
side with the declared splits and the D2D traffic each board measured, the verdict present, the
files written, no fleet left behind. Which side wins is not asserted: at this time scale the host,
not the modelled link, sets the pace (docs/performance.md has a run that decides)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from calculet.ops.sim_packages import build_sim_package
from calculet.ops.sim_packages.parallelism import TRAFFIC
from tests.integration.calctl_process import run_calctl

pytestmark = pytest.mark.integration

DEADLINE_S = 180.0


def test_compare_runs_the_same_workload_on_both_packages(tmp_path: Path) -> None:
    for form in ("tp", "ep"):
        build_sim_package("tiny", tmp_path / f"tiny-{form}", decode_batches=(4,), parallelism=form)
    out = tmp_path / "out"
    proc = run_calctl(
        "bench", "compare", str(tmp_path / "tiny-tp"), str(tmp_path / "tiny-ep"), "--dir", str(out),
        "--requests", "3", "--warmup", "1", "--concurrency", "2", "--output-tokens", "8", "--time-scale", "0.05",
        timeout=DEADLINE_S,
    )  # fmt: skip
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    doc = json.loads((out / "compare.json").read_text())
    assert doc["schema"] == "calculet.bench.compare/1" and doc["time_scale"] == 0.05
    a, b = doc["sides"]
    assert (a["label"], a["parallelism"], b["label"], b["parallelism"]) == ("A", "tp", "B", "ep")
    assert (a["d2d_bytes_per_token"], b["d2d_bytes_per_token"]) == (TRAFFIC["tp"][0], TRAFFIC["ep"][0])
    for side in (a, b):
        assert side["error"] is None and (side["completed"], side["failed"]) == (3, 0)
        assert side["goodput_tokens_per_s"] is not None and side["output_tokens_per_s"] > 0
        assert 0 < side["d2d_share_of_compute"] < 1  # measured by the board, from Status
    # 4x the bytes a token on EP; the jobs each side ran differ by their batching only.
    assert b["d2d_bytes_per_output_token"] > 1.9 * a["d2d_bytes_per_output_token"] > 0
    assert doc["verdict"]["reason"] and (doc["verdict"]["winner"] in (None, "A", "B"))
    assert "| parallelism | tp | ep |" in (out / "compare.md").read_text()
    assert not list((out / "fleets").glob("*/*.sock"))  # both fleets stopped
