"""`calctl resume`: admit new jobs again after a drain (Resume RPC, operations plane; idempotent).

Prints whether the board was draining. Exit 0, or 1 when the daemon refuses or is unreachable.
An exhausted reset budget is not cleared by this (only a successful operator reset clears it).
"""

from __future__ import annotations

import argparse

from calculet.ops.commands.daemon_cmds import EXIT_OK, add_daemon_arguments, connect, print_json

COMMAND = ("resume",)
HELP = "Admit new jobs again after a drain."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_daemon_arguments(parser)


def run(args: argparse.Namespace) -> int:
    with connect(args) as client:
        resp = client.resume()
    if args.json:
        print_json(resp)
    else:
        print("board admitting again" if resp.was_draining else "board was not draining; nothing changed")
    return EXIT_OK
