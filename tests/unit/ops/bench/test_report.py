"""The JSON report's schema (keys, milliseconds, nulls for what cannot be computed), the rich table
built from it, and the plot (matplotlib optional: a clear error without it)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from calculet.common.errors import FailedPrecondition
from calculet.ops.bench import plot
from calculet.ops.bench.device_stats import (
    BoardSample,
    SlotSample,
    UtilizationSample,
    board_utilization,
    fleet_busy_ratio,
)
from calculet.ops.bench.report import SCHEMA, board_json, report_json
from calculet.ops.bench.runner import BenchResult
from calculet.ops.bench.slo import Slo
from calculet.ops.bench.summary import summarize
from calculet.ops.bench.table import render_report

from .factories import failed, record, sample

CONFIG = {
    "target": {"kind": "gateway", "address": "unix:gw.sock", "status_daemons": ["unix:b0.sock", "unix:b1.sock"]},
    "model": "qwen",
    "schedule": {"mode": "closed", "concurrency": 2},
    "slo_ms": {"ttft": 200.0},
}


def _result() -> BenchResult:
    records = (
        record(0.0, [(0.125, 1), (0.25, 1)], 0.25, index=0, prompt_tokens=3),
        record(0.0, [(0.5, 2)], 0.75, index=1, prompt_tokens=5),
        failed(2, 0.25, 1.0),
    )
    boards = (
        board_utilization(BoardSample("unix:b0.sock", sample(1.0, 0.5)), BoardSample("unix:b0.sock", sample(3.0, 2.0))),
        board_utilization(BoardSample("unix:b1.sock", None, "unavailable: down"), BoardSample("unix:b1.sock", None)),
    )
    return BenchResult(
        summary=summarize(records, 0.0, Slo.parse("ttft:200")),
        boards=boards,
        busy_ratio=fleet_busy_ratio(boards),
        records=records,
        window_start=0.0,
        warmup_failed=1,
    )


def test_the_json_report_has_the_documented_keys_in_milliseconds() -> None:
    report = json.loads(json.dumps(report_json(_result(), CONFIG)))  # plain JSON, no NaN or objects
    assert report["schema"] == SCHEMA
    assert set(report) == {
        "schema", "config", "counts", "duration_s", "throughput", "goodput", "latency_ms", "device", "errors"
    }  # fmt: skip
    assert report["counts"] == {
        "requests": 3, "completed": 2, "failed": 1, "warmup_failed": 1, "prompt_tokens": 8, "output_tokens": 4,
        "requested_output_tokens": 2 + 2 + 8, "itl_by_chunk_requests": 0,
    }  # fmt: skip
    assert report["duration_s"] == 1.0
    assert report["throughput"]["requests_per_s"] == 2.0 and report["throughput"]["output_tokens_per_s"] == 4.0
    # ttft 125 ms yes (request 0, 2 output tokens), 500 ms no
    good = {"good_requests": 1, "requests_per_s": 1.0, "output_tokens": 2, "output_tokens_per_s": 2.0}
    assert report["goodput"] == good
    ttft = report["latency_ms"]["ttft"]
    assert ttft == {
        "count": 2,
        "mean": 312.5,
        "p50": 312.5,
        "p90": pytest.approx(462.5),
        "p95": pytest.approx(481.25),
        "p99": pytest.approx(496.25),
    }
    assert report["latency_ms"]["tpot"]["count"] == 2
    assert report["latency_ms"]["itl"] == {
        "count": 1,
        "mean": 125.0,
        "p50": 125.0,
        "p90": 125.0,
        "p95": 125.0,
        "p99": 125.0,
    }
    b0, b1 = report["device"]["boards"]
    assert report["device"]["busy_ratio"] == pytest.approx(1.5 / 2.0)
    assert b0["busy_ratio"] == pytest.approx(0.75) and b0["phases_s"]["compute"] == pytest.approx(1.5)
    assert b1["error"] == "unavailable: down" and b1["busy_ratio"] is None and b1["phases_s"]["h2d"] is None
    assert report["errors"] == ["request 2: unavailable: board down"]


def _text(report: dict[str, Any]) -> str:
    console = Console(width=160, record=True, no_color=True)
    console.print(render_report(report))
    return console.export_text()


def test_the_table_shows_the_figures_and_n_a_for_what_could_not_be_read() -> None:
    text = _text(report_json(_result(), CONFIG))
    assert "gateway unix:gw.sock" in text and "closed loop, concurrency 2" in text
    assert "2 / 1" in text  # completed / failed
    assert "goodput (ttft <= 200 ms)" in text and "1.00 req/s (1 good)" in text
    assert "312.50" in text  # TTFT mean, ms
    assert "busy 75.0 %" in text
    assert "n/a: unavailable: down" in text
    assert "error: request 2: unavailable: board down" in text


def test_an_all_failed_run_shows_n_a_latencies() -> None:
    result = BenchResult(summarize([failed(0, 0.0, 1.0)], 0.0, Slo()), (), None, (), 0.0, 0)
    report = report_json(result, CONFIG | {"slo_ms": {}})
    assert report["goodput"] is None and report["latency_ms"]["e2e"]["p99"] is None
    assert "n/a" in _text(report)


def test_plot_without_matplotlib_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(plot.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FailedPrecondition, match=r"--plot needs matplotlib: pip install 'calculet\[bench\]'"):
        plot.write_plot(tmp_path / "p.png", report_json(_result(), CONFIG), _result().records, 0.0)
    assert not (tmp_path / "p.png").exists()


def test_throughput_series_buckets_tokens_and_counts_requests_in_flight() -> None:
    records = [
        record(0.0, [(0.1, 1), (0.9, 3)], 1.0, index=0),
        record(0.5, [(0.6, None), (0.7, None)], 0.8, output_tokens=4, index=1),  # 2 tokens per chunk
    ]
    centres, rate, in_flight = plot.throughput_series(records, 0.0, 1.0)
    width = 1.0 / plot.BUCKETS
    assert len(centres) == plot.BUCKETS and centres[0] == pytest.approx(width / 2)
    assert sum(r * width for r in rate) == pytest.approx(8.0)  # every token once
    assert rate[int(0.9 / width)] * width == pytest.approx(3.0)
    assert in_flight[0] == 1 and in_flight[int(0.65 / width)] == 2 and in_flight[-1] == 1


def test_plot_writes_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "bench.png"
    plot.write_plot(out, report_json(_result(), CONFIG), _result().records, 0.0)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_board_reports_what_sampling_copied_per_row() -> None:
    before = BoardSample("b0", dataclasses.replace(sample(1.0, 0.5), d2h_bytes=1000, sampled_rows=10))
    after = BoardSample(
        "b0", dataclasses.replace(sample(3.0, 2.0), d2h_bytes=1000 + 40 * 1542, sampled_rows=50, full_row_reads=4)
    )
    copies = board_json(board_utilization(before, after))["copies"]
    assert copies == {
        "d2h_bytes": 40 * 1542,
        "sampled_rows": 40,
        "full_row_reads": 4,
        "d2h_bytes_per_row": 1542.0,
        "full_row_read_share": 0.1,
        "sampling_us_per_row": pytest.approx((2.0 / 4 - 0.5 / 4) * 1e6 / 40),
    }
    gone = board_json(board_utilization(BoardSample("b1", None, "unavailable: down"), after))
    assert gone["copies"] is None


def test_a_board_reports_its_cross_chip_traffic_over_the_window() -> None:
    before = BoardSample("b0", dataclasses.replace(sample(1.0, 0.5), d2d_s=0.25, d2d_bytes=1_000))
    after = BoardSample("b0", dataclasses.replace(sample(3.0, 2.0), d2d_s=1.0, d2d_bytes=9_000))
    assert board_json(board_utilization(before, after))["d2d"] == {"seconds": 0.75, "bytes": 8_000}
    assert board_json(board_utilization(BoardSample("b1", None, "unavailable: down"), after))["d2d"] is None


def test_a_board_reports_its_batch_fill_and_compactions_per_1k_tokens() -> None:
    def at(tokens: int, active: int, compiled: int, compactions: int) -> UtilizationSample:
        slots = SlotSample(active, compiled, compactions, fixed=True)
        return dataclasses.replace(sample(1.0, 0.5), generated_tokens=tokens, slots=slots)

    before, after = BoardSample("b0", at(100, 10, 40, 1)), BoardSample("b0", at(2100, 1510, 2040, 5))
    assert board_json(board_utilization(before, after))["slots"] == {
        "fixed": True,
        "batch_fill": 0.75,
        "compactions": 4,
        "compactions_per_1k_tokens": 2.0,
    }
    older = BoardSample("b0", dataclasses.replace(sample(1.0, 0.5), slots=None))  # a daemon without the field
    assert board_json(board_utilization(older, after))["slots"] is None
    result = dataclasses.replace(_result(), boards=(board_utilization(before, after),))
    text = _text(report_json(result, CONFIG))
    assert "decode rows over the run" in text and "75.0 %" in text and "2.00" in text
