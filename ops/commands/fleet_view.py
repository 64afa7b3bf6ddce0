"""The fleet table of `calctl status` (many boards) and `calctl top`, and the `--json` document;
not a command itself (no COMMAND).

Pure functions from `BoardRow`s to a rich `Table` (one row per board: board name and target,
health, each model with its generation and state, lanes used/total per model, queue, device jobs in
flight, tokens/s, device busy %, resets; the error in place of the models for an unreachable board)
and to the documented JSON document `{"boards": [row, ...]}` (shape: `board_rows`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.table import Table
from rich.text import Text

from calculet.ops.commands.board_rows import UNREACHABLE, BoardRow

COLUMNS = ("board", "health", "models", "lanes", "queue", "in flight", "tokens/s", "busy %", "resets")
_HEALTH_STYLE = {"serving": "green", "draining": "yellow", "not_serving": "red", UNREACHABLE: "bold red"}


def fleet_json(rows: Sequence[BoardRow]) -> dict[str, Any]:
    """The `--json` document of `calctl status` (and each refresh of `calctl top --json`)."""
    return {"boards": [row.to_json() for row in rows]}


def fleet_table(rows: Sequence[BoardRow], title: str | None = None) -> Table:
    """The boards, one row each, in the given order."""
    table = Table(title=title, title_justify="left")
    for name in COLUMNS:
        right = name not in ("board", "health", "models")
        table.add_column(name, justify="right" if right else "left", overflow="fold")
    for row in rows:
        table.add_row(*_cells(row))
    return table


def _cells(row: BoardRow) -> list[str | Text]:
    board = f"{row.name}\n{row.target}" if row.name else row.target
    health = Text(row.health.upper(), style=_HEALTH_STYLE.get(row.health, ""))
    if not row.reachable:
        return [board, health, Text(row.error or "", style="red"), "", "", "", "", "", ""]
    models = "\n".join(f"{m.alias} g{m.generation} {m.state.upper()}" for m in row.models) or "-"
    lanes = "\n".join(f"{m.lanes_used}/{m.lanes_total}" for m in row.models) or "-"
    return [
        board, health, models, lanes, _number(row.queue), _number(row.inflight),
        _figure(row.tokens_per_second, "{:.1f}"), _figure(row.busy_ratio, "{:.0%}"), _number(row.resets),
    ]  # fmt: skip


def _number(value: int | None) -> str:
    return "-" if value is None else str(value)


def _figure(value: float | None, form: str) -> str:
    return "-" if value is None else form.format(value)
