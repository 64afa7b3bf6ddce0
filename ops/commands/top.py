"""`calctl top`: the fleet table of `calctl status`, live, refreshed every --interval seconds until
Ctrl-C (or --iterations refreshes) (Status RPC, observation plane).

Boards as for `calctl status`: `--daemon` repeated (or the one default), or `--gateway URL`, whose
board list is asked again at every refresh (boards come and go). On a terminal the table is redrawn
in place (`rich.live.Live`); otherwise each refresh prints its table after the previous one, and
`--json` prints one `{"boards": [...]}` document per refresh, one per line (JSON lines; the shape of
`calctl status --json`). Exit status: that of the last refresh (0, or 1 when a board did not answer,
with one line on stderr); Ctrl-C ends the loop without a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import math
import time
from collections.abc import Callable, Iterator

from rich.console import Console
from rich.live import Live
from rich.table import Table

from calculet.ops.commands.access import access_from
from calculet.ops.commands.board_rows import BoardRow
from calculet.ops.commands.daemon_cmds import console
from calculet.ops.commands.daemon_status import unreachable_problem
from calculet.ops.commands.fleet_status import add_fleet_arguments, check_fleet_arguments, collect_rows, fleet_targets
from calculet.ops.commands.fleet_view import fleet_json, fleet_table

COMMAND = ("top",)
HELP = "The fleet table of `status`, refreshed live until Ctrl-C (or --iterations)."
DEFAULT_INTERVAL_S = 2.0
MIN_INTERVAL_S = 0.1


def interval_seconds(text: str) -> float:
    """argparse type: seconds >= 0.1. Raises argparse.ArgumentTypeError otherwise."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number of seconds") from None
    if not math.isfinite(value) or value < MIN_INTERVAL_S:
        raise argparse.ArgumentTypeError(f"{text}: must be at least {MIN_INTERVAL_S:g} seconds")
    return value


def iterations_count(text: str) -> int:
    """argparse type: an integer >= 1. Raises argparse.ArgumentTypeError otherwise."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value}: must be >= 1")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_fleet_arguments(parser)
    parser.add_argument(
        "--interval",
        type=interval_seconds,
        default=DEFAULT_INTERVAL_S,
        metavar="S",
        help=f"seconds between refreshes (default {DEFAULT_INTERVAL_S:g}, at least {MIN_INTERVAL_S:g})",
    )
    parser.add_argument(
        "--iterations", type=iterations_count, metavar="N", help="stop after N refreshes (default: until Ctrl-C)"
    )


def run(args: argparse.Namespace) -> int:
    check_fleet_arguments(args)
    access = access_from(args)
    fixed = None if args.gateway else fleet_targets(args)

    last: list[BoardRow] = []

    def refresh() -> list[BoardRow]:
        last[:] = collect_rows(fixed if fixed is not None else fleet_targets(args), access)
        return last

    out = console()
    show = _printed if args.json or not out.is_terminal else _live
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C is how an operator stops top
        show(refresh, args, out)
    return unreachable_problem(last)


def _printed(refresh: Callable[[], list[BoardRow]], args: argparse.Namespace, out: Console) -> None:
    """Each refresh printed after the previous one (JSON lines with --json)."""
    for n in _ticks(args):
        rows = refresh()
        if args.json:
            print(json.dumps(fleet_json(rows)), flush=True)
        else:
            out.print(_table(rows, args, n))


def _live(refresh: Callable[[], list[BoardRow]], args: argparse.Namespace, out: Console) -> None:
    """The table redrawn in place on a terminal."""
    with Live(console=out, auto_refresh=False) as live:
        for n in _ticks(args):
            live.update(_table(refresh(), args, n), refresh=True)


def _ticks(args: argparse.Namespace) -> Iterator[int]:
    """Refresh numbers from 1 (to --iterations, or without end), sleeping --interval seconds between
    two (the pause is the point of the command, nothing races it)."""
    n = 1
    while args.iterations is None or n <= args.iterations:
        if n > 1:
            time.sleep(args.interval)
        yield n
        n += 1


def _table(rows: list[BoardRow], args: argparse.Namespace, n: int) -> Table:
    now = dt.datetime.now().strftime("%H:%M:%S")
    boards = f"{len(rows)} board{'s' if len(rows) != 1 else ''}"
    return fleet_table(rows, title=f"calctl top: {boards} at {now}, refresh {n}, every {args.interval:g} s")
