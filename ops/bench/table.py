"""The human-readable report of a run: rich tables built from the JSON report (so the two can never
disagree): the run (counts, window, throughput, goodput), latencies (mean and percentiles in ms),
the device (busy ratio and phase seconds per board), the timing model when the report has one
(`timing_table.py`), the turns of a multi-turn run (`multiturn/table.py`), the answers checked of a
structured or tools run (`structured/report.py`), and the first errors. A
figure that could not be computed shows as "n/a".
"""

from __future__ import annotations

from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from calculet.ops.bench.multiturn.table import turn_table
from calculet.ops.bench.structured.report import validity_table
from calculet.ops.bench.timing_table import timing_table

NA = "n/a"


def _num(value: float | None, fmt: str = ".2f") -> str:
    return NA if value is None else format(value, fmt)


def _pct(value: float | None) -> str:
    return NA if value is None else f"{value * 100:.1f} %"


def run_table(report: dict[str, Any]) -> Table:
    counts, tp, good = report["counts"], report["throughput"], report["goodput"]
    table = Table(title="calctl bench", show_header=False, title_justify="left")
    table.add_column("figure")
    table.add_column("value", justify="right")
    config = report["config"]
    target = config["target"]
    table.add_row("target", f"{target['kind']} {target.get('address') or ', '.join(target.get('daemons', []))}")
    table.add_row("model / schedule", f"{config['model']} / {_schedule(config['schedule'])}")
    table.add_row("requests completed / failed", f"{counts['completed']} / {counts['failed']}")
    table.add_row("prompt / output tokens", f"{counts['prompt_tokens']} / {counts['output_tokens']}")
    table.add_row("measured window (s)", _num(report["duration_s"], ".3f"))
    table.add_row("requests/s", _num(tp["requests_per_s"]))
    table.add_row("output tokens/s", _num(tp["output_tokens_per_s"], ".1f"))
    table.add_row("total tokens/s", _num(tp["total_tokens_per_s"], ".1f"))
    if good is not None:
        slo = ", ".join(f"{k} <= {v:g} ms" for k, v in config["slo_ms"].items())
        table.add_row(f"goodput ({slo})", f"{_num(good['requests_per_s'])} req/s ({good['good_requests']} good)")
        table.add_row("goodput output tokens/s", _num(good.get("output_tokens_per_s"), ".1f"))
    return table


def _schedule(schedule: dict[str, Any]) -> str:
    if schedule["mode"] == "closed":
        return f"closed loop, concurrency {schedule['concurrency']}"
    if schedule["mode"] == "conversations":
        return f"{schedule['users']} conversations of {schedule['turns']} turns"
    return f"open loop, {schedule['rate']} req/s, burstiness {schedule['burstiness']}"


def latency_table(report: dict[str, Any]) -> Table:
    table = Table(title="latency (ms)", title_justify="left")
    for name in ("metric", "count", "mean", "p50", "p90", "p95", "p99"):
        table.add_column(name, justify="left" if name == "metric" else "right")
    for metric, stats in report["latency_ms"].items():
        row = [_num(stats.get(k)) for k in ("mean", "p50", "p90", "p95", "p99")]
        table.add_row(metric.upper(), str(stats["count"]), *row)
    return table


def device_table(report: dict[str, Any]) -> Table:
    device = report["device"]
    table = Table(title=f"device over the run: busy {_pct(device['busy_ratio'])}", title_justify="left")
    names = ("board", "busy", "device s", "h2d s", "compute s", "d2h s", "sampling s", "tokens", "D2H B/row",
             "rows read", "sampling us/row")  # fmt: skip
    for name in names:
        table.add_column(name, justify="left" if name == "board" else "right")
    for board in device["boards"]:
        if board["error"] is not None:
            table.add_row(board["target"], Text(f"n/a: {board['error']}", style="yellow"), *[""] * (len(names) - 2))
            continue
        phases = board["phases_s"]
        cells = [_num(phases[k], ".3f") for k in ("h2d", "compute", "d2h", "sampling")]
        tokens = board["generated_tokens"]
        copies = board.get("copies") or {}
        copied = [
            _num(copies.get("d2h_bytes_per_row"), ".0f"),
            _pct(copies.get("full_row_read_share")),
            _num(copies.get("sampling_us_per_row"), ".1f"),
        ]
        busy, device_s = _pct(board["busy_ratio"]), _num(board["device_s"], ".3f")
        table.add_row(board["target"], busy, device_s, *cells, str(tokens), *copied)
    return table


def slots_table(report: dict[str, Any]) -> Table:
    """The decode rows of each board that reports them (docs/daemon.md, "Fixed slots")."""
    table = Table(title="decode rows over the run", title_justify="left")
    for name in ("board", "slots", "batch fill", "compactions", "per 1k tokens"):
        table.add_column(name, justify="left" if name in ("board", "slots") else "right")
    for board in report["device"]["boards"]:
        if (slots := board.get("slots")) is not None:
            kind = "fixed" if slots["fixed"] else "any lane"
            per_1k = _num(slots["compactions_per_1k_tokens"], ".2f")
            table.add_row(board["target"], kind, _pct(slots["batch_fill"]), str(slots["compactions"]), per_1k)
    return table


def render_report(report: dict[str, Any]) -> RenderableType:
    """Every table of the report, and its errors, as one renderable."""
    parts: list[RenderableType] = [run_table(report), latency_table(report)]
    if "multiturn" in report:
        parts.append(turn_table(report))
    if "validity" in report:
        parts.append(validity_table(report))
    if report["device"]["boards"]:
        parts.append(device_table(report))
    if any(board.get("slots") for board in report["device"]["boards"]):
        parts.append(slots_table(report))
    if "timing_model" in report:
        parts.append(timing_table(report))
    if report["counts"]["itl_by_chunk_requests"]:
        n = report["counts"]["itl_by_chunk_requests"]
        parts.append(Text(f"ITL of {n} request(s) is per SSE chunk: their chunks' token counts are unknown"))
    for error in report["errors"]:
        parts.append(Text(f"error: {error}", style="red"))
    return Group(*parts)
