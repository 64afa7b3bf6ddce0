"""The machine-readable report of a run (`--json OUT`): a stable schema, documented in
docs/benchmarking.md ("JSON schema"). Version `SCHEMA`; a change that renames or removes a key bumps
it, adding keys does not.

Top-level keys: `schema`, `config` (what was asked: target, model, schedule, workload, SLO),
`counts`, `duration_s`, `throughput`, `goodput`, `latency_ms` (ttft, tpot, itl, e2e: count, mean,
p50, p90, p95, p99 in milliseconds, null without values), `device` (fleet busy ratio and each
board's figures over the run, with the versions it reported: Runtime, driver, firmware, and each
model's package, package hash, calbin hash and compiler) and `errors` (the first failures). Numbers
are plain JSON numbers; a figure that cannot be computed is null, never 0.
"""

from __future__ import annotations

from typing import Any

from calculet.ops.bench.device_stats import BoardUtilization
from calculet.ops.bench.runner import BenchResult
from calculet.ops.bench.summary import BenchSummary, LatencyStats

SCHEMA = "calculet.bench/1"


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


def latency_ms(stats: LatencyStats) -> dict[str, Any]:
    return {
        "count": stats.count,
        "mean": _ms(stats.mean),
        "p50": _ms(stats.p50),
        "p90": _ms(stats.p90),
        "p95": _ms(stats.p95),
        "p99": _ms(stats.p99),
    }


def board_json(board: BoardUtilization) -> dict[str, Any]:
    return {
        "target": board.target,
        "error": board.error,
        "device_s": board.device_s,
        "busy_s": board.busy_s,
        "busy_ratio": board.busy_ratio,
        "banks": [{"bank": bank, "busy_s": busy, "busy_ratio": ratio} for bank, busy, ratio in board.banks],
        "phases_s": {"h2d": board.h2d_s, "compute": board.compute_s, "d2h": board.d2h_s, "sampling": board.sampling_s},
        "versions": board.versions.to_json() if board.versions is not None else None,
        "generated_tokens": board.generated_tokens,
        "copies": copies_json(board),
        "d2d": None if board.error is not None else {"seconds": board.d2d_s, "bytes": board.d2d_bytes},
        "slots": slots_json(board),
    }


def slots_json(board: BoardUtilization) -> dict[str, Any] | None:
    """The decode rows over the run (docs/daemon.md, "Fixed slots"): the batch fill (active /
    compiled rows), the compactions and their rate per 1,000 generated tokens, whether the board
    runs fixed slots; null when unread."""
    f = board.slots
    if board.error is not None or f is None:
        return None
    return {
        "fixed": f.fixed,
        "batch_fill": f.fill,
        "compactions": f.compactions,
        "compactions_per_1k_tokens": f.compactions_per_1k_tokens,
    }


def copies_json(board: BoardUtilization) -> dict[str, Any] | None:
    """What sampling copied over the run (issue 22): D2H bytes and their share per sampled row,
    rows read in full and their share, host sampling microseconds per row; null when unread."""
    rows = board.sampled_rows
    if board.error is not None or rows is None or board.d2h_bytes is None:
        return None
    per_row = (lambda v: v / rows) if rows else (lambda _v: None)
    return {
        "d2h_bytes": board.d2h_bytes,
        "sampled_rows": rows,
        "full_row_reads": board.full_row_reads,
        "d2h_bytes_per_row": per_row(board.d2h_bytes),
        "full_row_read_share": per_row(board.full_row_reads or 0),
        "sampling_us_per_row": per_row((board.sampling_s or 0.0) * 1e6),
    }


def goodput_json(s: BenchSummary) -> dict[str, Any] | None:
    """The requests meeting every SLO, and their output tokens, per second of the window (None without one)."""
    if s.good_requests is None:
        return None
    return {
        "good_requests": s.good_requests,
        "requests_per_s": s.goodput,
        "output_tokens": s.good_output_tokens,
        "output_tokens_per_s": s.goodput_tokens,
    }


def report_json(result: BenchResult, config: dict[str, Any]) -> dict[str, Any]:
    """The report of `result`; `config` is the command's description of the run."""
    s = result.summary
    return {
        "schema": SCHEMA,
        "config": config,
        "counts": {
            "requests": s.requests,
            "completed": s.completed,
            "failed": s.failed,
            "warmup_failed": result.warmup_failed,
            "prompt_tokens": s.prompt_tokens,
            "output_tokens": s.output_tokens,
            "requested_output_tokens": s.requested_output_tokens,
            "itl_by_chunk_requests": s.itl_by_chunk_requests,
        },
        "duration_s": s.duration_s,
        "throughput": {
            "requests_per_s": s.request_throughput,
            "output_tokens_per_s": s.output_throughput,
            "total_tokens_per_s": s.total_token_throughput,
        },
        "goodput": goodput_json(s),
        "latency_ms": {name: latency_ms(getattr(s, name)) for name in ("ttft", "tpot", "itl", "e2e")},
        "device": {"busy_ratio": result.busy_ratio, "boards": [board_json(b) for b in result.boards]},
        "errors": list(s.errors),
    }
