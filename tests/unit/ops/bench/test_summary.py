"""Percentiles, throughput over the measured window, goodput under SLOs and failure counting, from
hand-made records; expected values worked out by hand."""

from __future__ import annotations

import pytest

from calculet.common.errors import InvalidArgument
from calculet.ops.bench.latency import RequestLatency
from calculet.ops.bench.slo import Slo
from calculet.ops.bench.summary import MAX_ERRORS, LatencyStats, summarize

from .factories import failed, record


def test_percentiles_interpolate_linearly_between_closest_ranks() -> None:
    stats = LatencyStats.of([float(v) for v in (7, 1, 10, 3, 5, 9, 2, 8, 4, 6)])
    # sorted 1..10; rank (n-1)*q: p50 at 4.5 -> 5.5, p90 at 8.1 -> 9.1, p99 at 8.91 -> 9.91
    assert (stats.count, stats.mean) == (10, pytest.approx(5.5))
    assert stats.p50 == pytest.approx(5.5)
    assert stats.p90 == pytest.approx(9.1)
    assert stats.p99 == pytest.approx(9.91)


def test_no_values_give_no_figures_rather_than_zero() -> None:
    assert LatencyStats.of([]) == LatencyStats(0, None, None, None, None)
    one = LatencyStats.of([0.25])
    assert (one.mean, one.p50, one.p90, one.p99) == (0.25, 0.25, 0.25, 0.25)


def _run() -> list:  # type: ignore[type-arg]
    return [
        # (times are exact binary fractions, so a limit equal to a value compares exactly)
        # ttft 0.125, e2e 0.5, 5 tokens -> tpot 0.375 / 4 = 0.09375
        record(0.0, [(0.125, 1), (0.25, 2), (0.5, 2)], 0.5, index=0, prompt_tokens=10),
        # ttft 0.25, e2e 1.5, 3 tokens -> tpot 1.25 / 2 = 0.625
        record(0.5, [(0.75, 1), (1.25, 1), (2.0, 1)], 2.0, index=1, prompt_tokens=6),
        failed(2, 1.0, 4.0),  # the last end: the window is 0 .. 4.0
    ]


def test_counts_throughput_and_window() -> None:
    s = summarize(_run(), window_start=0.0, slo=Slo())
    assert (s.requests, s.completed, s.failed) == (3, 2, 1)
    assert (s.prompt_tokens, s.output_tokens, s.requested_output_tokens) == (16, 8, 5 + 3 + 8)
    assert s.duration_s == pytest.approx(4.0)
    assert s.request_throughput == pytest.approx(2 / 4.0)
    assert s.output_throughput == pytest.approx(8 / 4.0)
    assert s.total_token_throughput == pytest.approx((8 + 16) / 4.0)
    assert s.errors == ("request 2: unavailable: board down",)
    assert s.good_requests is None and s.goodput is None  # no SLO given
    assert s.good_output_tokens is None and s.goodput_tokens is None
    assert s.ttft.count == 2 and s.ttft.mean == pytest.approx((0.125 + 0.25) / 2)
    assert s.tpot.mean == pytest.approx((0.09375 + 0.625) / 2)
    assert s.e2e.p50 == pytest.approx((0.5 + 1.5) / 2)
    # itl: request 0: 0.125/2 twice, 0.25/2 twice; request 1: 0.5, 0.75
    assert s.itl.count == 6 and s.itl.mean == pytest.approx((0.0625 * 2 + 0.125 * 2 + 0.5 + 0.75) / 6)


@pytest.mark.parametrize(
    ("slo", "good", "tokens"),
    [
        ("ttft:200", 1, 5),  # 125 ms passes (request 0, 5 tokens), 250 ms does not
        ("ttft:250", 2, 8),  # the limit itself passes
        ("tpot:100", 1, 5),
        ("ttft:1000,tpot:700", 2, 8),
        ("ttft:1000,tpot:500", 1, 5),  # both meet the TTFT, only one the TPOT
        ("e2e:1500", 2, 8),
        ("e2e:1000", 1, 5),  # request 1's E2E is 1.5 s
        ("e2e:400", 0, 0),
    ],
)
def test_goodput_counts_requests_meeting_every_objective(slo: str, good: int, tokens: int) -> None:
    s = summarize(_run(), window_start=0.0, slo=Slo.parse(slo))
    assert s.good_requests == good
    assert s.goodput == pytest.approx(good / 4.0)
    assert s.good_output_tokens == tokens  # the good requests' output tokens, over the 4 s window
    assert s.goodput_tokens == pytest.approx(tokens / 4.0)


def test_a_single_token_request_meets_any_tpot_objective() -> None:
    lat = RequestLatency(ttft=0.01, e2e=0.01, tpot=None, itls=(), itl_by_chunk=False)
    assert Slo.parse("tpot:1").met(lat)
    assert not Slo.parse("ttft:5").met(lat)


def test_errors_keep_the_first_few_in_request_order() -> None:
    records = [failed(i, 0.0, 1.0, f"aborted: job {i}") for i in range(MAX_ERRORS + 3)]
    s = summarize(records, 0.0, Slo())
    assert s.failed == MAX_ERRORS + 3 and s.completed == 0
    assert s.errors == tuple(f"request {i}: aborted: job {i}" for i in range(MAX_ERRORS))
    assert s.output_throughput == 0.0 and s.ttft.count == 0


def test_an_empty_run_has_no_rates() -> None:
    s = summarize([], 5.0, Slo())
    assert s.duration_s == 0.0 and s.request_throughput is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("ttft", "expected KEY:MS"),
        ("latency:5", "expected KEY:MS"),
        ("ttft:5,ttft:6", "ttft given twice"),
        ("ttft:abc", "'abc' is not a number"),
        ("tpot:0", "positive number"),
        ("tpot:-3", "positive number"),
        ("e2e:inf", "positive number"),
        ("ttft:5,", "expected KEY:MS"),
    ],
)
def test_bad_slo_is_refused_clearly(text: str, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        Slo.parse(text)


def test_slo_in_milliseconds_round_trips() -> None:
    slo = Slo.parse("tpot:12.5, ttft:200")
    assert slo.ttft_s == pytest.approx(0.2) and slo.tpot_s == pytest.approx(0.0125) and slo.e2e_s is None
    assert slo.as_ms() == {"ttft": pytest.approx(200.0), "tpot": pytest.approx(12.5)}
