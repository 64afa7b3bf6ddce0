"""Figures relative to the timing model, from a hand-made record and the table of timing_factories.py.

The request (prompt 10, output 3) alone at one row has the floors TTFT 32.5 ms, decode step 14.15 ms
(two steps of 11.1 + 3 and 11.2 + 3 ms) and E2E 60.8 ms (test_limit.py). At time scale 2 those take
twice as long on the wall. The record: sent at 0, tokens at 0.1, 0.13 and 0.16 s, done at 0.16 s.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from calculet.ops.bench.device_model import DeviceModel
from calculet.ops.bench.device_stats import BoardUtilization
from calculet.ops.bench.limit import Policy, Serving
from calculet.ops.bench.relative import TimingContext, mean_in_flight, timing_json
from calculet.ops.bench.runner import BenchResult
from calculet.ops.bench.slo import Slo
from calculet.ops.bench.summary import summarize
from calculet.ops.sim_packages import build_sim_package

from .factories import failed, record
from .timing_factories import device_model


def result(busy_s: float | None = 0.04) -> BenchResult:
    rec = record(0.0, [(0.1, 1), (0.13, 1), (0.16, 1)], 0.16, prompt_tokens=10)
    board = BoardUtilization("unix:b0.sock", None, device_s=0.1, busy_s=busy_s)
    return BenchResult(summarize([rec], 0.0, Slo()), (board,), None, (rec,), 0.0, 0)


def context(scale: float, inflight: int = 1) -> TimingContext:
    return TimingContext("pkg", device_model(), Serving(Policy.CONTINUOUS, inflight), scale, boards=1)


def test_every_figure_over_its_modelled_floor() -> None:
    tm = timing_json(context(2.0), result(), concurrency=1)
    assert tm["load"] == {"in_flight": 1.0, "rows": 1, "decode_batch": 1}
    assert tm["floors_ms"] == pytest.approx({"ttft": 32.5, "decode_step": 14.15, "e2e": 60.8})
    rel = tm["relative"]
    assert rel["ttft"]["p50"] == pytest.approx(0.1 / (2 * 0.0325))
    assert rel["tpot"]["p50"] == pytest.approx(0.03 / (2 * 0.01415))
    assert rel["itl"]["count"] == 2 and rel["itl"]["p99"] == pytest.approx(0.03 / (2 * 0.01415))
    assert rel["e2e"]["mean"] == pytest.approx(0.16 / (2 * 0.0608))
    # 3 tokens in 0.16 s against 3 tokens per 60.8 modelled ms, i.e. per 121.6 wall ms
    assert rel["throughput"] == pytest.approx(0.76)
    assert rel["busy_of_wall"] == pytest.approx(0.04 * 2 / 0.16)
    assert tm["tpot_excess_ms"]["p50"] == pytest.approx(30.0 - 2 * 14.15)


def test_the_limit_section() -> None:
    tm = timing_json(context(1.0, inflight=2), result(), concurrency=1)
    assert (tm["policy"], tm["max_inflight"], tm["boards"], tm["decode_batches"], tm["lanes"]) == (
        "continuous", 2, 1, [1, 2], 2
    )  # fmt: skip
    limit = tm["limit"]
    assert limit["device_s"] == pytest.approx(0.0428)  # compute: 20.5 + 22.3 ms (copies overlap)
    assert limit["serial_s"] == pytest.approx(0.0608)
    assert limit["overlap_ratio"] == pytest.approx(0.018 / 0.0608)
    assert limit["output_tokens_per_s"] == pytest.approx(3 / 0.0428)
    assert [b["rows"] for b in tm["limit_by_batch"]] == [1, 2]


def test_several_boards_multiply_the_limit() -> None:
    ctx = TimingContext("pkg", device_model(), Serving(Policy.CONTINUOUS, 1), 1.0, boards=4)
    tm = timing_json(ctx, result(), concurrency=4)
    assert tm["load"]["rows"] == 1  # four clients over four boards
    assert tm["limit"]["output_tokens_per_s"] == pytest.approx(4 * 3 / 0.0608)


def test_time_scale_0_has_no_ratio() -> None:
    tm = timing_json(context(0.0), result(), concurrency=1)
    rel = tm["relative"]
    assert rel["ttft"]["count"] == 0 and rel["ttft"]["p50"] is None
    assert rel["throughput"] is None and rel["busy_of_wall"] is None
    assert tm["tpot_excess_ms"]["p50"] == pytest.approx(30.0)


def test_an_open_loop_uses_the_mean_in_flight() -> None:
    tm = timing_json(context(1.0), result(), concurrency=None)
    assert tm["load"]["in_flight"] == pytest.approx(1.0)
    recs = [record(0.0, [(0.1, 1)], 0.2), record(0.1, [(0.2, 1)], 0.4)]
    assert mean_in_flight(recs, 0.4) == pytest.approx(0.5 / 0.4)


def test_no_completed_request_gives_no_figures() -> None:
    rec = failed(0, 0.0, 0.1)
    res = BenchResult(summarize([rec], 0.0, Slo()), (), None, (rec,), 0.0, 0)
    tm = timing_json(context(1.0), res, concurrency=1)
    assert tm["limit"] is None and tm["relative"] is None and tm["limit_by_batch"] == []


def test_every_figure_is_finite_on_a_real_package(tmp_path: Path) -> None:
    package = build_sim_package("tiny", tmp_path / "tiny", decode_batches=[1, 4])
    model = DeviceModel.from_package(package)
    ctx = TimingContext(str(package), model, Serving(Policy.CONTINUOUS, 2), 1.0, boards=1)
    tm = timing_json(ctx, result(), concurrency=1)
    for name in ("ttft", "tpot", "itl", "e2e"):
        assert math.isfinite(tm["relative"][name]["p50"])
    assert math.isfinite(tm["relative"]["throughput"])
