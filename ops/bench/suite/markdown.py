"""Markdown building blocks of the suite's reports (`report.py`, `multiturn_report.py`): numbers and
shares as text ("n/a" for what could not be computed), tables, a safe walk into the JSON records,
the block of every run's command and the list of errors. Pure functions; no I/O."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

NA = "n/a"


def num(value: float | None, fmt: str = ".1f") -> str:
    return NA if value is None else format(value, fmt)


def pct(value: float | None) -> str:
    return NA if value is None else f"{100 * value:.1f} %"


def row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """A markdown table: the first column left-aligned, the others right-aligned."""
    aligns = ["---"] + ["---:"] * (len(header) - 1)
    return [row(header), row(aligns), *(row(r) for r in rows)]


def get(record: dict[str, Any], *path: str) -> Any:
    """`record[path[0]][path[1]]...`, None where a level is missing or null."""
    value: Any = record
    for key in path:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value


def commands(records: Sequence[dict[str, Any]]) -> list[str]:
    """A folded block with the `calctl bench` command of every run (or why it did not run)."""
    lines = ["<details><summary>the command of each row</summary>", "", "```sh"]
    for r in records:
        lines.append(r["command"] or f"# {r['name']}: not run ({r['error']})")
    return [*lines, "```", "</details>", ""]


def errors(records: Sequence[dict[str, Any]]) -> list[str]:
    return [f"- `{r['name']}`: {r['error']}" for r in records if r.get("error")]
