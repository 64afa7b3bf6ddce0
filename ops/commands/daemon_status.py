"""`calctl status`: the whole board as the daemon sees it (Status RPC, observation plane).

Prints a readable summary (`status_view.render_status`): board, device memory per chip, models
with state, generation and lanes (state and KV length per lane), queues, unfinished jobs,
counters, resets and policy; or the StatusResponse as JSON. Exit 0, or 1 when the daemon is
unreachable or refuses (printed by calctl as `calctl: <kind>: <message>`).
"""

from __future__ import annotations

import argparse

from calculet.ops.commands.daemon_cmds import EXIT_OK, add_daemon_arguments, connect, console, print_json
from calculet.ops.commands.status_view import render_status

COMMAND = ("status",)
HELP = "Show a daemon's board, memory, models, lanes, queues, jobs, counters and resets."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_daemon_arguments(parser)


def run(args: argparse.Namespace) -> int:
    with connect(args) as client:
        status = client.status()
    if args.json:
        print_json(status)
    else:
        console().print(render_status(status))
    return EXIT_OK
