"""`calctl drain [--timeout S] [--interrupt]`: stop admitting on the board (Drain RPC, operations plane).

The board refuses new jobs until `calctl resume`; the daemon waits up to the timeout for running
jobs and, with --interrupt, ends the rest with UNAVAILABLE (the gateway resumes them elsewhere).
Exit 0 when nothing is left running, 1 when jobs remain (or the daemon refused / is unreachable),
so `calctl drain --timeout 60 && systemctl stop ...` is safe.
"""

from __future__ import annotations

import argparse

from calculet.ops.commands.daemon_cmds import (
    EXIT_OK,
    add_daemon_arguments,
    connect,
    print_json,
    problem,
    to_ms,
    window_seconds,
)

COMMAND = ("drain",)
HELP = "Stop admitting new jobs on the board and wait for running ones (exit 1 if some remain)."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--timeout", type=window_seconds, metavar="S", help="seconds to wait for running jobs (default: daemon's)"
    )
    parser.add_argument(
        "--interrupt", action="store_true", help="at the timeout, end remaining jobs (resumable elsewhere)"
    )
    add_daemon_arguments(parser)


def run(args: argparse.Namespace) -> int:
    with connect(args) as client:
        resp = client.drain(timeout_ms=to_ms(args.timeout), interrupt_remaining=args.interrupt)
    if args.json:
        print_json(resp)
    else:
        print(
            f"board draining: {'drained' if resp.drained else 'NOT drained'}, {resp.remaining_jobs} job(s) remaining, "
            f"{resp.interrupted_jobs} interrupted"
        )
    if not resp.drained:
        return problem(f"drain: {resp.remaining_jobs} job(s) still running or queued")
    return EXIT_OK
