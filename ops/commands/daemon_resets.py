"""`calctl resets`: the board's reset audit trail (Status RPC, observation plane).

One row per reset, oldest first, as the reset controller recorded it: when, kind, automatic or
operator, the fault it answered, the client jobs it hit (recovered / failed), the serving models and
the board's health before and after, and the result; then the automatic-reset budget. `--json`
prints the `ResetSummary` message. Exit 0; 1 when the daemon is unreachable.
"""

from __future__ import annotations

import argparse
import datetime as dt

from rich.table import Table

from calculet.ops.commands.daemon_cmds import EXIT_OK, add_daemon_arguments, connect, console, print_json
from calculet.v1 import common_pb2, observe_pb2

COMMAND = ("resets",)
HELP = "Show every reset of a board (automatic and operator), with the budget."

_KIND_PREFIX = "RESET_KIND_"
_HEALTH = {
    common_pb2.SERVING_STATUS_SERVING: "serving",
    common_pb2.SERVING_STATUS_DRAINING: "draining",
    common_pb2.SERVING_STATUS_NOT_SERVING: "not serving",
}


def kind_name(kind: int) -> str:
    """A reset kind as the audit names it: the enum's own name ("ccu", "device", "switch", ...),
    so a kind the proto gains is named too; a number this build does not know stays a number."""
    try:
        return common_pb2.ResetKind.Name(kind).removeprefix(_KIND_PREFIX).lower()
    except ValueError:
        return f"kind {kind}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_daemon_arguments(parser)


def reset_table(summary: observe_pb2.ResetSummary) -> Table:
    """The audit trail as a table, oldest first."""
    table = Table(title=f"resets: {summary.count} since start", title_justify="left")
    for column in ("at", "kind", "by", "fault", "jobs hit", "models", "health", "result"):
        # The reason is what an operator reads first: keep a short one on one line in 80 columns.
        table.add_column(column, min_width=24 if column == "fault" else None)
    for r in summary.history:
        at = dt.datetime.fromtimestamp(r.at.seconds + r.at.nanos / 1e9).isoformat(timespec="seconds")
        models = ", ".join(r.generations_before) or "-"
        if list(r.generations_after) != list(r.generations_before):
            models += f" -> {', '.join(r.generations_after) or '-'}"
        table.add_row(
            at,
            kind_name(r.kind),
            "automatic" if r.automatic else "operator",
            f"{r.fault}: {r.reason}" if r.reason else r.fault,
            f"{r.inflight_jobs} ({r.recovered} recovered, {r.failed} failed)",
            models,
            f"{_HEALTH.get(r.health_before, '?')} -> {_HEALTH.get(r.health_after, '?')}",
            ("ok" if r.ok else "FAILED") + (f": {r.message}" if r.message else ""),
        )
    return table


def budget_line(summary: observe_pb2.ResetSummary) -> str:
    b = summary.budget
    state = "exhausted: the board waits for an operator reset" if b.exhausted else "available"
    return f"automatic reset budget: {b.used} of {b.limit} used in the last {b.window_s:g} s ({state})"


def run(args: argparse.Namespace) -> int:
    with connect(args) as client:
        summary = client.status().resets
    if args.json:
        print_json(summary)
        return EXIT_OK
    out = console()
    out.print(reset_table(summary))
    out.print(budget_line(summary))
    return EXIT_OK
