"""Shared pieces of the calctl commands that talk to a daemon (status, health, load, unload,
drain, resume); not a command itself (no COMMAND).

Owns: the `--daemon TARGET` / `--json` arguments, where the target comes from (flag, then
`CALCULET_DAEMON`, then `unix:run/board0.sock`), the bearer token from `CALCULET_TOKEN` (never a
flag: command lines are visible in `ps`), argparse types for targets and durations, and printing
protobuf answers as JSON. Data flow: argparse namespace -> `connect(args)` -> `DaemonClient`;
its typed errors propagate to `calctl.main`, which prints `calctl: <kind>: <message>` and exits 1.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

from google.protobuf import json_format
from google.protobuf.message import Message
from rich.console import Console

from calculet.client import DaemonClient, parse_target
from calculet.daemon.errors import InvalidArgument

ENV_DAEMON = "CALCULET_DAEMON"
ENV_TOKEN = "CALCULET_TOKEN"
DEFAULT_DAEMON = "unix:run/board0.sock"
MAX_WINDOW_S = 3600.0  # operate.proto: drain windows are at most 3,600,000 ms
EXIT_OK, EXIT_PROBLEM = 0, 1


def target_type(text: str) -> str:
    """argparse type: a daemon target (see `calculet.client.channel.parse_target`).

    Raises:
        argparse.ArgumentTypeError: not a valid target.
    """
    try:
        parse_target(text)
    except InvalidArgument as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def window_seconds(text: str) -> float:
    """argparse type: seconds in 0..3600 (a drain window).

    Raises:
        argparse.ArgumentTypeError: not a number, negative, not finite or above 3600.
    """
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number of seconds") from None
    if not math.isfinite(value) or not 0.0 <= value <= MAX_WINDOW_S:
        raise argparse.ArgumentTypeError(f"{text}: must be between 0 and {MAX_WINDOW_S:g} seconds")
    return value


def add_daemon_arguments(parser: argparse.ArgumentParser, *, json_output: bool = True) -> None:
    parser.add_argument(
        "--daemon",
        type=target_type,
        metavar="TARGET",
        help=f"daemon address: unix:PATH, PATH.sock or host:port (default: ${ENV_DAEMON} or {DEFAULT_DAEMON})",
    )
    if json_output:
        parser.add_argument("--json", action="store_true", help="print the daemon's answer as JSON")


def daemon_target(args: argparse.Namespace) -> str:
    """The target from the flag, else the environment, else the default."""
    return args.daemon or os.environ.get(ENV_DAEMON) or DEFAULT_DAEMON


def connect(args: argparse.Namespace) -> DaemonClient:
    """A client of the chosen daemon; the caller closes it.

    Raises:
        InvalidArgument: a bad `CALCULET_DAEMON` or `CALCULET_TOKEN` value.
    """
    return DaemonClient(daemon_target(args), token=os.environ.get(ENV_TOKEN) or None)


def to_ms(seconds: float | None) -> int | None:
    return None if seconds is None else round(seconds * 1000)


def message_dict(message: Message) -> dict[str, object]:
    """A protobuf message as JSON-ready data (proto field names, zero values included)."""
    return json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )


def print_json(message: Message, *, one_line: bool = False) -> None:
    print(json.dumps(message_dict(message), indent=None if one_line else 2, sort_keys=False))


def problem(text: str) -> int:
    """Report a problem on stderr (one line, like calctl.main does for errors); returns exit 1."""
    print(f"calctl: {text}", file=sys.stderr)
    return EXIT_PROBLEM


def console() -> Console:
    """A rich console on the current stdout (wide and plain when it is not a terminal)."""
    return Console() if sys.stdout.isatty() else Console(width=160, no_color=True)
