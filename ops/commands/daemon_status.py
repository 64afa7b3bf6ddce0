"""`calctl status`: one board in detail, or a fleet one row per board (Status RPC, observation plane).

- One daemon (`--daemon TARGET` once, or `$CALCULET_DAEMON`, or the default): the detailed view of
  `status_view.render_status` (board, device memory per chip, models with lanes, queues, jobs,
  counters, resets); an unreachable daemon is one `calctl: <kind>: <message>` line.
- Several (`--daemon` repeated, or `--gateway URL`: the boards the gateway serves from): the fleet
  table of `fleet_view` (health, models and generations, lanes, queue, in flight, tokens/s, busy %,
  resets), Status asked of every board at once; an unreachable board is a row with the error.
- `--json`: always `{"boards": [...]}`, one object per board, the documented stable shape
  (`board_rows`; docs/operations.md). `--json --full`: one daemon's whole StatusResponse as
  protobuf's JSON mapping (follows the proto; not pinned).

Exit 0 when every board answered; 1 when one did not (after printing the others), or when the
gateway cannot be asked; 2 for usage errors.
"""

from __future__ import annotations

import argparse
import json
import sys

from calculet.ops.commands.access import access_from
from calculet.ops.commands.board_rows import BoardRow
from calculet.ops.commands.daemon_cmds import EXIT_OK, UsageError, connect, console, print_json, problem
from calculet.ops.commands.fleet_status import add_fleet_arguments, check_fleet_arguments, collect_rows, fleet_targets
from calculet.ops.commands.fleet_view import fleet_json, fleet_table
from calculet.ops.commands.status_view import render_status

COMMAND = ("status",)
HELP = "Show one board in detail, or many (--daemon repeated, --gateway) one row per board."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_fleet_arguments(parser)
    parser.add_argument(
        "--full", action="store_true", help="with --json and one daemon: its whole StatusResponse (proto's JSON)"
    )


def run(args: argparse.Namespace) -> int:
    check_fleet_arguments(args)
    many = bool(args.gateway) or len(args.daemon or ()) > 1
    if args.full and (many or not args.json):
        raise UsageError("--full goes with --json and one daemon")
    if args.full or (not many and not args.json):
        return _one_board(args)
    rows = collect_rows(fleet_targets(args), access_from(args))
    if args.json:
        print(json.dumps(fleet_json(rows), indent=2))
    else:
        console().print(fleet_table(rows))
    return unreachable_problem(rows)


def _one_board(args: argparse.Namespace) -> int:
    with connect(args, args.daemon[0] if args.daemon else None) as client:
        status = client.status()
    if args.json:
        print_json(status)
    else:
        console().print(render_status(status))
    return EXIT_OK


def unreachable_problem(rows: list[BoardRow]) -> int:
    """Exit 0, or 1 with one line on stderr naming the boards that did not answer."""
    down = [row for row in rows if not row.reachable]
    if not down:
        return EXIT_OK
    sys.stdout.flush()
    names = "; ".join(f"{row.target} ({row.error})" for row in down)
    return problem(f"{len(down)} of {len(rows)} boards unreachable: {names}")
