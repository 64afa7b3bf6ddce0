"""Per-request latency definitions from hand-made records; every expected figure is worked out
here from the definitions (docs/benchmarking.md) with plain arithmetic."""

from __future__ import annotations

import pytest

from calculet.common.errors import InvalidArgument
from calculet.ops.bench.latency import chunk_token_counts, request_latency
from calculet.ops.bench.records import RequestRecord

from .factories import failed, record


def test_known_chunks_give_ttft_tpot_e2e_and_itl_divided_among_the_tokens_of_each_chunk() -> None:
    # sent at 10.000; 1 token at 10.100, 2 at 10.130, 3 at 10.190; stream complete at 10.200
    rec = record(10.0, [(10.100, 1), (10.130, 2), (10.190, 3)], 10.200)
    lat = request_latency(rec)
    assert lat.ttft == pytest.approx(0.100)
    assert lat.e2e == pytest.approx(0.200)
    assert lat.tpot == pytest.approx((0.200 - 0.100) / (6 - 1))  # 20 ms
    # gap 30 ms over 2 tokens, then 60 ms over 3 tokens
    assert lat.itls == pytest.approx((0.015, 0.015, 0.020, 0.020, 0.020))
    assert not lat.itl_by_chunk


def test_tokens_of_the_first_chunk_beyond_the_first_have_no_itl() -> None:
    rec = record(0.0, [(0.5, 3), (0.8, 1)], 0.8)
    lat = request_latency(rec)
    assert lat.ttft == pytest.approx(0.5)
    assert lat.tpot == pytest.approx(0.3 / 3)
    assert lat.itls == pytest.approx((0.3,))


def test_one_token_has_no_tpot_and_no_itl() -> None:
    lat = request_latency(record(1.0, [(1.25, 1)], 1.5))
    assert lat.ttft == pytest.approx(0.25)
    assert lat.e2e == pytest.approx(0.5)
    assert lat.tpot is None
    assert lat.itls == ()


def test_unknown_counts_with_one_chunk_per_output_token_are_single_tokens() -> None:
    rec = record(0.0, [(0.1, None), (0.3, None), (0.4, None)], 0.5, output_tokens=3)
    assert chunk_token_counts(rec) == [1, 1, 1]
    lat = request_latency(rec)
    assert lat.itls == pytest.approx((0.2, 0.1))
    assert not lat.itl_by_chunk
    assert lat.tpot == pytest.approx((0.5 - 0.1) / 2)


def test_unknown_counts_that_cannot_be_inferred_give_one_itl_per_chunk_gap() -> None:
    # 2 SSE chunks stood for 5 tokens: which chunk held how many is not known
    rec = record(0.0, [(0.1, None), (0.4, None)], 0.45, output_tokens=5)
    assert chunk_token_counts(rec) is None
    lat = request_latency(rec)
    assert lat.itls == pytest.approx((0.3,))
    assert lat.itl_by_chunk
    assert lat.tpot == pytest.approx((0.45 - 0.1) / 4)  # TPOT still uses the usage count


def test_a_failed_or_tokenless_record_has_no_latency() -> None:
    with pytest.raises(InvalidArgument, match="request 3 has no latencies: unavailable: board down"):
        request_latency(failed(3, 0.0, 1.0))
    empty = RequestRecord(4, 8, 0.0)
    empty.finish(1.0, 0)
    assert not empty.ok and empty.error == "the stream ended without a token"
    with pytest.raises(InvalidArgument, match="without a token"):
        request_latency(empty)
