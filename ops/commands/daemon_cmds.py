"""Shared pieces of the calctl commands that talk to daemons (status, top, health, resets, load,
unload, drain, resume, rollout); not a command itself (no COMMAND).

Owns: the `--daemon TARGET` / `--json` arguments (plus the TLS and token ones of `access.py`), where
the target comes from (flag, then `CALCULET_DAEMON`, then `unix:run/board0.sock`), argparse types for
targets and durations, and printing protobuf answers as JSON. `--daemon` is given once to the
commands of one board (twice is a usage error) and is repeatable for the fleet commands
(`add_daemon_arguments(many=True)`). Data flow: argparse namespace -> `connect(args)` ->
`DaemonClient` (TLS and token from `access.access_from`); its typed errors propagate to
`calctl.main`, which prints `calctl: <kind>: <message>` and exits 1. `connection_hint` adds the
likely cause to an UNAVAILABLE (plaintext to a TCP daemon, a certificate for another name).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
from collections.abc import Iterator

from google.protobuf import json_format
from google.protobuf.message import Message
from rich.console import Console

from calculet.client import DaemonClient, Transport, parse_target
from calculet.common.errors import InvalidArgument, Unavailable
from calculet.ops.commands.access import ENV_TOKEN, DaemonAccess, StoreOnce, access_from, add_access_arguments

__all__ = ["ENV_TOKEN"]  # re-exported: tests and scripts import it from here

ENV_DAEMON = "CALCULET_DAEMON"
DEFAULT_DAEMON = "unix:run/board0.sock"
MAX_WINDOW_S = 3600.0  # operate.proto: drain windows are at most 3,600,000 ms
EXIT_OK, EXIT_PROBLEM = 0, 1


class UsageError(Exception):
    """A combination of flags a command refuses; calctl prints it with the command's usage, exit 2."""


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


def add_daemon_arguments(parser: argparse.ArgumentParser, *, json_output: bool = True, many: bool = False) -> None:
    """`--daemon` (once, or repeatable with `many`), `--json`, and the TLS/token arguments."""
    where = "unix:PATH, PATH.sock or host:port"
    default = f"default: ${ENV_DAEMON} or {DEFAULT_DAEMON}"
    parser.add_argument(
        "--daemon",
        type=target_type,
        action="append" if many else StoreOnce,
        metavar="TARGET",
        help=f"daemon address: {where}; repeatable, one per board ({default})"
        if many
        else f"daemon address: {where}, given once ({default})",
    )
    if json_output:
        parser.add_argument("--json", action="store_true", help="print the answer as JSON")
    add_access_arguments(parser)


def daemon_target(args: argparse.Namespace) -> str:
    """The target from the flag, else the environment, else the default."""
    return args.daemon or os.environ.get(ENV_DAEMON) or DEFAULT_DAEMON


def daemon_targets(args: argparse.Namespace) -> list[str]:
    """The targets of a fleet command (`many=True`): the flags, else the environment's one, else
    the default. Raises: InvalidArgument: a bad `CALCULET_DAEMON`."""
    return list(args.daemon or [_env_target()])


def _env_target() -> str:
    target = os.environ.get(ENV_DAEMON) or DEFAULT_DAEMON
    parse_target(target)
    return target


@contextlib.contextmanager
def connect(args: argparse.Namespace, target: str | None = None) -> Iterator[DaemonClient]:
    """`with connect(args) as client:` a client of `target` (default: `daemon_target(args)`; TLS
    and token from `access.access_from`), closed at the end; an UNAVAILABLE raised inside gets
    `connection_hint`.

    Raises:
        InvalidArgument: a bad `CALCULET_DAEMON` or `CALCULET_TOKEN` value, an unreadable token
            file, inconsistent TLS settings or unreadable TLS files.
    """
    access, target = access_from(args), target or daemon_target(args)
    with access.client(target) as client:
        try:
            yield client
        except Unavailable as err:
            hinted = connection_hint(err, target, access)
            if hinted is err:
                raise
            raise hinted from err


def connection_hint(err: Unavailable, target: str, access: DaemonAccess) -> Unavailable:
    """`err`, with the likely cause added when it has a usual one: a TCP daemon dialled without TLS
    (a daemon on TCP requires TLS unless started with --insecure), or a certificate that does not
    name the host dialled. Otherwise `err` itself."""
    text = str(err)
    if access.plaintext and parse_target(target).transport is Transport.TCP:
        return Unavailable(f"{text} (dialled in plaintext: give --tls-ca if the daemon serves TLS)")
    if not access.plaintext and "Hostname Verification" in text:
        return Unavailable(f"{text} (the daemon's certificate does not name this host: give --tls-server-name)")
    return err


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
