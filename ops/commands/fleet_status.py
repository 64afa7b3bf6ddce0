"""Which boards a fleet command covers and their rows, for `calctl status`, `top` and `rollout`; not a
command itself (no COMMAND).

Owns: `--daemon` (repeatable) versus `--gateway URL` (the gateway's boards), and collecting one
`BoardRow` per board, the Status calls made in parallel (one thread per board, at most
`MAX_PARALLEL`) so that one slow or dead board does not hold up the others beyond the call timeout.
A board that fails answers with an "unreachable" row carrying the error; nothing is swallowed:
callers count such rows into their exit status. Data flow: args -> `fleet_targets` (targets) ->
`collect_rows(targets, access)` -> rows in target order.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from calculet.common.errors import CalculetError, Unavailable
from calculet.ops.commands.access import DaemonAccess
from calculet.ops.commands.board_rows import BoardRow, board_row, unreachable_row
from calculet.ops.commands.daemon_cmds import UsageError, add_daemon_arguments, connection_hint, daemon_targets
from calculet.ops.commands.gateway_boards import Gateway, add_gateway_arguments

MAX_PARALLEL = 16
STATUS_TIMEOUT_S = 10.0


def add_fleet_arguments(parser: argparse.ArgumentParser, *, json_output: bool = True) -> None:
    """`--daemon` (repeatable), `--gateway`, `--api-key-file`, `--json`, TLS and token."""
    add_daemon_arguments(parser, json_output=json_output, many=True)
    add_gateway_arguments(parser)


def check_fleet_arguments(args: argparse.Namespace) -> None:
    """Raises: UsageError (exit 2): --gateway with --daemon, --api-key-file without --gateway."""
    if args.gateway and args.daemon:
        raise UsageError("give --daemon or --gateway, not both")
    if args.api_key_file and not args.gateway:
        raise UsageError("--api-key-file goes with --gateway")


def fleet_targets(args: argparse.Namespace) -> list[str]:
    """The boards: the gateway's (sorted), else the --daemon flags in order, else the default one.

    Raises:
        Unavailable: the gateway cannot be asked or knows no boards.
        InvalidArgument: a bad API key file or `CALCULET_DAEMON`.
    """
    if args.gateway:
        return Gateway.from_args(args).targets()
    return daemon_targets(args)


def collect_rows(targets: Sequence[str], access: DaemonAccess, timeout: float = STATUS_TIMEOUT_S) -> list[BoardRow]:
    """One row per target, in order: its Status, or an unreachable row with the error."""
    if not targets:
        return []
    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(targets)), thread_name_prefix="calctl-status") as pool:
        return list(pool.map(lambda target: board_status_row(target, access, timeout), targets))


def board_status_row(target: str, access: DaemonAccess, timeout: float = STATUS_TIMEOUT_S) -> BoardRow:
    """The row of one board (its Status call failing gives an unreachable row)."""
    try:
        with access.client(target, timeout=timeout) as client:
            return board_row(target, client.status())
    except Unavailable as err:
        return unreachable_row(target, connection_hint(err, target, access))
    except CalculetError as err:
        return unreachable_row(target, err)
