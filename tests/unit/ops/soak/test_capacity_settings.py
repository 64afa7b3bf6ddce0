"""Capacity (the timing model's and the calibrated one), the run's derived settings, durations and
the report's thinning."""

from __future__ import annotations

import pytest

from calculet.ops.bench.limit import Policy, Serving, workload_limit
from calculet.ops.soak.capacity import calibrated, calibration_seconds, modelled
from calculet.ops.soak.durations import format_duration, parse_duration
from calculet.ops.soak.mix import request_shapes
from calculet.ops.soak.report import thin
from calculet.ops.soak.settings import job_timeout_for, warmup_for
from tests.unit.ops.bench.timing_factories import device_model
from tests.unit.ops.soak.factories import spec

POOL = [spec(n=2), spec(("a", "b"), (4, 6), max_tokens=10)]


def test_modelled_capacity_is_the_pool_over_its_limit_per_board_and_scale() -> None:
    model = device_model(batches=(1, 2), lanes=2)
    limit = workload_limit(model, [s for p in POOL for s in request_shapes(p)], Serving(Policy.CONTINUOUS, 2), 2)
    plan = modelled(model, POOL, 2, 1.0, 0.5)
    assert plan.capacity_per_s == pytest.approx(2 * 2 / limit.device_s)
    assert plan.rate_per_s == pytest.approx(plan.capacity_per_s * 0.5)
    slower = modelled(model, POOL, 2, 4.0, 0.5)
    assert slower.capacity_per_s == pytest.approx(plan.capacity_per_s / 4)
    assert slower.typical_e2e_s == pytest.approx(plan.typical_e2e_s * 4)
    assert plan.detail["rows"] == 2 and plan.method == "timing-model"
    with pytest.raises(ValueError):
        modelled(model, POOL, 2, 0.0, 0.5)


def test_calibrated_capacity_is_the_measured_rate_and_the_median_e2e() -> None:
    plan = calibrated(10.0, [0.2, 0.4, 0.9], 0.7, {"concurrency": 8})
    assert plan.rate_per_s == pytest.approx(7.0) and plan.typical_e2e_s == pytest.approx(0.4)
    assert plan.to_json()["concurrency"] == 8
    with pytest.raises(ValueError):
        calibrated(0.0, [], 0.7, {})


def test_calibration_and_warm_up_scale_with_the_run_within_bounds() -> None:
    assert calibration_seconds(120) == 15 and calibration_seconds(1800) == 90 and calibration_seconds(86400) == 120
    assert warmup_for(120) == 10 and warmup_for(1800) == 90 and warmup_for(86400) == 300


def test_the_job_timeout_covers_the_longest_prefill_at_the_time_scale() -> None:
    model = device_model()
    assert job_timeout_for(model, POOL, 0.0) == 3.0
    # the longest prompt (4 + 10 + 6 + 15 = 35 tokens): copies 35 + 2 ms, compute 5 + 35 + 0.1 * 630 = 103 ms
    assert job_timeout_for(model, POOL, 100.0) == 30  # ceil(2 * 0.14 * 100 + 1)


@pytest.mark.parametrize(
    "text, seconds", [("90s", 90), ("2m", 120), ("30m", 1800), ("2h", 7200), ("1.5h", 5400), ("45", 45)]
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "m", "0s", "-1m", "2d", "1h30m"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


def test_format_duration() -> None:
    assert [format_duration(s) for s in (90, 1800, 7200, 5430)] == ["1m30s", "30m", "2h", "1h30m30s"]


def test_thinning_keeps_the_ends_and_at_most_the_bound() -> None:
    rows = list(range(5000))
    kept = thin(rows, 100)
    assert len(kept) == 100 and kept[0] == 0 and kept[-1] == 4999
    assert thin(rows[:10], 100) == rows[:10]
