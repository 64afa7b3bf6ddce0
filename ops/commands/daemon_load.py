"""`calctl load ALIAS PACKAGE [--replace | --switch-from ALIAS@GEN]`: load a package under an alias
(Load RPC, operations plane); with --switch-from, switch the board from that generation to this
package (drain, unload and verify, configure, warm, publish; docs/models.md).

Prints one line per progress message as the daemon streams them (elapsed time, state,
generation, message, and bytes done / total while the phase counts bytes: VALIDATING hashes the
package files); on a terminal also a progress bar over the load's phases plus a byte row while a
phase has bytes (`load_progress.LoadBar`); with --json one JSON object per line (no bar; the
LoadProgress fields, `bytes_done` / `bytes_total` included, uint64 as strings). Exit 0 when
the alias is READY; 1 when the load FAILED (its typed error, e.g. failed_precondition for an invalid package, is
printed by calctl on stderr) or was refused (bad alias/path, unknown package, alias loaded without
--replace, concurrent load) or the daemon is unreachable. PACKAGE is relative to the daemon's
models root.
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import socket

from calculet.client.messages import Switch, load_outcome
from calculet.ops.commands.daemon_cmds import (
    EXIT_OK,
    add_daemon_arguments,
    connect,
    console,
    print_json,
    to_ms,
    window_seconds,
)
from calculet.ops.commands.load_progress import LoadBar, progress_line
from calculet.v1 import operate_pb2

COMMAND = ("load",)
HELP = "Load a package under an alias and stream its progress (exit 1 if the load fails)."


def positive_lanes(text: str) -> int:
    """argparse type: an integer >= 1. Raises argparse.ArgumentTypeError otherwise."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value}: must be >= 1")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("alias", metavar="ALIAS", help="name clients use for the model")
    parser.add_argument("package", metavar="PACKAGE", help="package directory, relative to the daemon's models root")
    parser.add_argument("--replace", action="store_true", help="replace a loaded alias with a new generation")
    parser.add_argument("--lanes", type=positive_lanes, metavar="N", help="KV lanes to configure (default: package's)")
    parser.add_argument(
        "--drain-timeout", type=window_seconds, metavar="S", help="with --replace: seconds to let old jobs finish"
    )
    parser.add_argument(
        "--switch-from",
        type=switch_target,
        metavar="ALIAS@GEN",
        help="switch: replace exactly this generation (refused if the board serves another; docs/models.md)",
    )
    parser.add_argument("--force", action="store_true", help="with --switch-from: ignore the minimum residency")
    parser.add_argument("--reason", default="", help="with --switch-from: why, for the board's audit trail")
    add_daemon_arguments(parser)


def switch_target(text: str) -> tuple[str, int]:
    """argparse type: `ALIAS@GENERATION`. Raises argparse.ArgumentTypeError otherwise."""
    alias, sep, generation = text.rpartition("@")
    if not sep or not alias or not generation.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r}: expected ALIAS@GENERATION, e.g. qwen@3")
    return alias, int(generation)


def requester() -> str:
    """Who asks, for the audit: `calctl (user@host)`."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no passwd entry and no LOGNAME/USER (a bare container)
        user = "unknown"
    return f"calctl ({user}@{socket.gethostname()})"


def run(args: argparse.Namespace) -> int:
    last: operate_pb2.LoadProgress | None = None
    out = console()
    bar = LoadBar(out, args.alias) if out.is_terminal and not args.json else None
    with connect(args) as client, bar or contextlib.nullcontext():
        switch = None
        if args.switch_from is not None:
            alias, generation = args.switch_from
            switch = Switch(alias, generation, args.force, args.reason, requester())
        stream = client.load(
            args.alias,
            args.package,
            replace=args.replace,
            drain_timeout_ms=to_ms(args.drain_timeout),
            lanes=args.lanes,
            switch=switch,
        )
        for last in stream:
            if args.json:
                print_json(last, one_line=True)
            elif bar is not None:
                bar.update(last)
            else:
                print(progress_line(last), flush=True)
            if last.done:
                break
    load_outcome(last, args.alias)  # raises the typed error of a failed or unfinished load
    return EXIT_OK
