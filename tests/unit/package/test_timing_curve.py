"""The decode curve's rules (`rules_model.decode_curve_problems`) and the retired linear form.

`test_validate.DEFECTS` runs each defect through a whole package; this file pins the rule itself:
which tables are refused, with which code, and that a valid table yields nothing.
"""

from __future__ import annotations

import math
from itertools import pairwise
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from calculet.daemon.package.manifest import (
    LEGACY_TIMING_FIELDS,
    MAX_DECODE_CURVE_POINTS,
    DecodePoint,
    ManifestError,
    PackageManifest,
)
from calculet.daemon.package.rules_model import decode_curve_problems
from calculet.ops.sim_packages.timing import sim_timing

from .conftest import valid_manifest

CONTEXT = 40_960


def _codes(points: list[tuple[int, float]], context: int = CONTEXT) -> list[str]:
    return [code for code, _, _ in decode_curve_problems(tuple(DecodePoint(c, ms) for c, ms in points), context)]


def test_the_seed_curve_is_valid() -> None:
    assert decode_curve_problems(sim_timing().decode_curve, CONTEXT) == []


@pytest.mark.parametrize(
    ("points", "code"),
    [
        ([], "timing.curve_points"),
        ([(CONTEXT, 20.0)], "timing.curve_points"),
        ([(CONTEXT, 20.0), (0, 17.0)], "timing.curve_order"),  # unsorted
        ([(0, 17.0), (4096, 30.0), (2048, 25.0), (CONTEXT, 90.0)], "timing.curve_order"),  # unsorted middle
        ([(0, 17.0), (2048, 20.0), (2048, 20.0), (CONTEXT, 90.0)], "timing.curve_order"),  # repeated context
        ([(0, 17.0), (2048, 30.0), (4096, 25.0), (CONTEXT, 90.0)], "timing.curve_monotonic"),  # speeds up
        ([(0, 90.0), (CONTEXT, 17.0)], "timing.curve_monotonic"),
        ([(0, 17.0), (CONTEXT - 1, 90.0)], "timing.curve_coverage"),
        ([(0, math.nan), (CONTEXT, 90.0)], "value.range"),
        ([(0, 17.0), (CONTEXT, math.inf)], "value.range"),
        ([(0, -1.0), (CONTEXT, 90.0)], "value.range"),
        ([(0, 0.0), (CONTEXT, 90.0)], "value.range"),
        ([(-1, 17.0), (CONTEXT, 90.0)], "value.range"),
    ],
    ids=[
        "empty", "one-point", "unsorted", "unsorted-middle", "repeated", "speeds-up", "falls",
        "short-of-context", "nan", "infinite", "negative-ms", "zero-ms", "negative-context",
    ],
)  # fmt: skip
def test_a_bad_table_is_refused_with_its_code(points: list[tuple[int, float]], code: str) -> None:
    assert _codes(points) == [code]


def test_too_many_points_are_refused() -> None:
    points = [(i, 1.0) for i in range(MAX_DECODE_CURVE_POINTS + 1)]
    assert _codes(points, context=10) == ["timing.curve_points"]
    assert _codes(points[:MAX_DECODE_CURVE_POINTS], context=10) == []


def test_equal_ms_is_allowed_and_the_last_point_may_pass_the_context() -> None:
    assert _codes([(0, 17.0), (512, 17.0), (CONTEXT + 1, 90.0)]) == []


def test_an_unordered_table_is_not_also_called_non_monotonic() -> None:
    problems = decode_curve_problems((DecodePoint(CONTEXT, 20.0), DecodePoint(0, 17.0), DecodePoint(5, 1.0)), CONTEXT)
    assert [c for c, _, _ in problems] == ["timing.curve_order"]
    assert "point 1 at 0 follows 40,960" in problems[0][2]


@given(st.lists(st.tuples(st.integers(0, 50_000), st.floats(0.01, 500.0)), min_size=2, max_size=8))
def test_a_table_is_accepted_exactly_when_sorted_monotonic_and_covering(points: list[tuple[int, float]]) -> None:
    contexts, ms = [c for c, _ in points], [m for _, m in points]
    ok = all(a < b for a, b in pairwise(contexts)) and all(a <= b for a, b in pairwise(ms)) and max(contexts) >= CONTEXT
    assert (_codes(points) == []) is ok


def _legacy_raw() -> dict[str, Any]:
    raw = valid_manifest().to_dict()
    raw["timing"] = {
        "decode_ms_short": 17.2, "decode_ms_long": 80.0, "long_context": 256, "prefill_fixed_ms": 1.0,
        "prefill_ms_per_token": 0.1, "batch_alpha": 0.1, "h2d_gbps": 10.0, "d2h_gbps": 10.0,
    }  # fmt: skip
    return raw


def test_the_parser_refuses_the_retired_linear_form_with_a_clear_error() -> None:
    with pytest.raises(ManifestError) as info:
        PackageManifest.from_dict(_legacy_raw())
    assert info.value.code == "timing.legacy_line"
    assert "decode_curve" in str(info.value) and "rebuild" in str(info.value)
    assert all(name in str(info.value) for name in LEGACY_TIMING_FIELDS)


def test_the_curve_round_trips_through_json() -> None:
    m = valid_manifest()
    raw = m.to_dict()
    assert raw["timing"]["decode_curve"] == [{"context": 0, "ms_per_token": 1.0}, {"context": 256, "ms_per_token": 2.0}]
    assert PackageManifest.from_dict(raw) == m
