"""The human-readable view of a report's `timing_model` section (relative.py): the limit at the run's
load and the run's figures over the modelled device time, as one rich table beside `table.py`'s."""

from __future__ import annotations

from typing import Any

from rich.table import Table

NA = "n/a"


def _num(value: float | None, fmt: str) -> str:
    return NA if value is None else format(value, fmt)


def timing_table(report: dict[str, Any]) -> Table:
    """The `timing_model` section of `report` (which must have one)."""
    tm = report["timing_model"]
    title = f"timing model: {tm['policy']}, in-flight {tm['max_inflight']}, time scale {tm['time_scale']:g}"
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column("figure")
    table.add_column("value", justify="right")
    limit, rel = tm["limit"], tm["relative"]
    if limit is None or rel is None:
        table.add_row("limit", f"{NA}: no request completed")
        return table
    load = tm["load"]
    table.add_row("rows per decode step / compiled batch", f"{load['rows']} / {load['decode_batch']}")
    table.add_row("limit, output tokens per modelled s", _num(limit["output_tokens_per_s"], ".1f"))
    table.add_row("ping/pong overlap of the device time", f"{100 * limit['overlap_ratio']:.1f} %")
    table.add_row("throughput / limit", _num(rel["throughput"], ".3f"))
    table.add_row("compute busy of the wall time", _num(rel["busy_of_wall"], ".3f"))
    for name in ("ttft", "tpot", "itl", "e2e"):
        stats = rel[name]
        cells = " / ".join(_num(stats[q], ".2f") for q in ("p50", "p90", "p99"))
        table.add_row(f"{name.upper()} / modelled floor, p50 / p90 / p99", cells)
    table.add_row("TPOT excess over the step (ms), p50", _num(tm["tpot_excess_ms"]["p50"], ".2f"))
    return table
