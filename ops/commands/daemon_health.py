"""`calctl health`: is the board serving? (Health RPC, observation plane).

Prints the board's serving status, device health, reset budget and each model's status, or the
HealthResponse as JSON. Exit 0 when the board is SERVING, 1 otherwise (DRAINING, NOT_SERVING, or
the daemon unreachable), so it can gate scripts and probes.
"""

from __future__ import annotations

import argparse

from calculet.ops.commands.daemon_cmds import EXIT_OK, add_daemon_arguments, connect, print_json, problem
from calculet.ops.commands.status_view import health_lines, serving
from calculet.v1 import common_pb2

COMMAND = ("health",)
HELP = "Show whether a daemon is serving (exit 0 when SERVING, 1 otherwise)."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_daemon_arguments(parser)


def run(args: argparse.Namespace) -> int:
    with connect(args) as client:
        health = client.health()
    if args.json:
        print_json(health)
    else:
        print("\n".join(health_lines(health)))
    if health.status != common_pb2.SERVING_STATUS_SERVING:
        return problem(f"not serving: {serving(health.status)}" + (f": {health.reason}" if health.reason else ""))
    return EXIT_OK
