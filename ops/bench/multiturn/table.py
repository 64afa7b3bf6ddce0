"""The human-readable view of a report's `multiturn` section (report.py): one row per turn number
(requests, prompt tokens, the share served from cache and the share the previous turn carried, TTFT
p50 / p90 / p99, the modelled uncached TTFT) and the per-run targets of issue 19, as rich tables
beside `table.py`'s. Built from the JSON, so the two cannot disagree."""

from __future__ import annotations

from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from calculet.ops.bench.multiturn.targets import TargetCheck

NA = "n/a"
VERDICTS = {True: ("met", "green"), False: ("missed", "red"), None: ("not checked", "yellow")}


def _num(value: float | None, fmt: str = ".1f") -> str:
    return NA if value is None else format(value, fmt)


def _pct(value: float | None) -> str:
    return NA if value is None else f"{100 * value:.1f} %"


def turn_table(report: dict[str, Any]) -> RenderableType:
    """The `multiturn` section of `report` (which must have one)."""
    mt = report["multiturn"]
    title = (
        f"by turn: {mt['users']} users x {mt['turns']} turns; from cache {_pct(mt['cached_share'])} overall, "
        f"{_pct(mt['cached_share_later'])} from turn 2; {mt['later_turns']['missed']} of "
        f"{mt['later_turns']['requests']} later turns missed their lane"
    )
    table = Table(title=title, title_justify="left")
    header = ("turn", "ok / failed / skipped", "prompt tok", "cached", "carried", "missed", "TTFT p50 / p90 / p99 ms")
    for name in (*header, "modelled uncached ms"):
        table.add_column(name, justify="left" if name == "turn" else "right")
    for row in mt["per_turn"]:
        ttft = row["ttft_ms"]
        table.add_row(
            str(row["turn"]),
            f"{row['completed']} / {row['failed']} / {row['skipped']}",
            str(row["prompt_tokens"]),
            _pct(row["cached_share"]),
            _pct(row["carried_share"]),
            str(row["missed"]),
            " / ".join(_num(ttft[q]) for q in ("p50", "p90", "p99")),
            _num(row["modelled_uncached_ttft_ms"]),
        )
    parts: list[RenderableType] = [table]
    for target in (TargetCheck(**t) for t in mt["targets"]):
        verdict, style = VERDICTS[target.met]
        parts.append(Text(f"target {target.wanted}: {target.shown()}, {verdict} ({target.detail})", style=style))
    if mt["cache_reported"] == 0 and any(row["completed"] for row in mt["per_turn"]):
        parts.append(Text("the gateway's usage carried no prompt_tokens_details.cached_tokens: counted as 0"))
    return Group(*parts)
