"""`calctl unload ALIAS [--drain-timeout S]`: drain and unload an alias (Unload RPC, operations plane).

Returns when the alias is UNLOADED and prints the generation unloaded and how many jobs finished
or were interrupted (ended UNAVAILABLE, resumable elsewhere) at the drain timeout. Exit 0, or 1
when refused (unknown alias, loading/unloading) or unreachable.
"""

from __future__ import annotations

import argparse

from calculet.ops.commands.daemon_cmds import EXIT_OK, add_daemon_arguments, connect, print_json, to_ms, window_seconds

COMMAND = ("unload",)
HELP = "Drain and unload a model alias."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("alias", metavar="ALIAS", help="model alias to unload")
    parser.add_argument(
        "--drain-timeout",
        type=window_seconds,
        metavar="S",
        help="seconds to let running jobs finish (default: daemon's)",
    )
    add_daemon_arguments(parser)


def run(args: argparse.Namespace) -> int:
    with connect(args) as client:
        resp = client.unload(args.alias, drain_timeout_ms=to_ms(args.drain_timeout))
    if args.json:
        print_json(resp)
    else:
        print(
            f"unloaded {args.alias} generation {resp.generation}: {resp.drained_jobs} job(s) finished, "
            f"{resp.interrupted_jobs} interrupted"
        )
    return EXIT_OK
