"""`calctl rollout ALIAS PACKAGE (--daemon T ... | --gateway URL)`: a new package on every board, one
board at a time, without dropping traffic (Status, Drain, Load, Resume, Health RPCs; the operate
plane's token).

First every board is checked (`rollout_plan`): reachable, SERVING, not draining, serving ALIAS;
any problem refuses the rollout before anything changes. Then board by board, in order (the
--daemon flags' order; a gateway's boards sorted), `rollout_board.BoardRollout`: drain (running
jobs finish within --drain-timeout), load PACKAGE with replace and wait for READY (the golden check
passed), resume, and wait until traffic reaches the board again: with --gateway until the gateway
routes ALIAS to as many boards as before the rollout, else until the daemon reports SERVING
(--rejoin-timeout). One line per step. The first board that fails stops the rollout: it is resumed
on its old package (loaded again if the failed load had unloaded it) and keeps serving, the boards
after it are not touched. Exit 0 when every board serves PACKAGE; 1 when the rollout was refused or
stopped (one `calctl:` line on stderr says where and why; also after Ctrl-C, which leaves the
current board as it is); 2 for usage errors.

With one board the alias is unavailable on it while it reloads (nothing else can take its traffic).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import TypeVar

from calculet.client import DaemonClient
from calculet.common.errors import CalculetError, Unavailable
from calculet.ops.commands.access import access_from
from calculet.ops.commands.daemon_cmds import EXIT_OK, problem, to_ms, window_seconds
from calculet.ops.commands.fleet_status import add_fleet_arguments, check_fleet_arguments, fleet_targets
from calculet.ops.commands.gateway_boards import Gateway
from calculet.ops.commands.rollout_board import BoardRollout, Rejoin
from calculet.ops.commands.rollout_plan import BoardPlan, plan_rollout
from calculet.v1 import common_pb2

COMMAND = ("rollout",)
HELP = "Load a new package on every board, one at a time: drain, load, resume; stop at the first failure."
DEFAULT_DRAIN_S = 60.0
DEFAULT_REJOIN_S = 60.0
POLL_S = 0.2
T = TypeVar("T")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("alias", metavar="ALIAS", help="model alias to roll (served on every board now)")
    parser.add_argument("package", metavar="PACKAGE", help="new package directory, relative to the models root")
    add_fleet_arguments(parser, json_output=False)
    parser.add_argument(
        "--drain-timeout",
        type=window_seconds,
        default=DEFAULT_DRAIN_S,
        metavar="S",
        help=f"seconds to let a board's running jobs finish before its load (default {DEFAULT_DRAIN_S:g})",
    )
    parser.add_argument(
        "--interrupt",
        action="store_true",
        help="at the drain timeout, end the jobs still running (a gateway resumes them elsewhere) instead of stopping",
    )
    parser.add_argument(
        "--rejoin-timeout",
        type=window_seconds,
        default=DEFAULT_REJOIN_S,
        metavar="S",
        help=f"seconds to wait for a resumed board to take traffic again (default {DEFAULT_REJOIN_S:g})",
    )


def run(args: argparse.Namespace) -> int:
    check_fleet_arguments(args)
    access = access_from(args)
    gateway = Gateway.from_args(args) if args.gateway else None
    plans = plan_rollout(fleet_targets(args), access, args.alias)
    rejoin = _gateway_rejoin(gateway, args) if gateway is not None else _daemon_rejoin(args)
    _say(f"rollout of {args.alias} to {args.package} over {len(plans)} board(s), one at a time")
    for number, plan in enumerate(plans, start=1):
        board = BoardRollout(
            plan, alias=args.alias, package=args.package, access=access, window_ms=to_ms(args.drain_timeout) or 0,
            interrupt=args.interrupt, rejoin=rejoin, say=_board_say(number, len(plans), plan),
        )  # fmt: skip
        try:
            failure = board.run()
        except KeyboardInterrupt:
            failure = (
                f"interrupted while {board.life.state.value}: the board is left as it is (perhaps draining): check "
                f"`calctl status --daemon {plan.target}` and `calctl resume` it"
            )
        if failure is not None:
            return _stopped(plans, number, failure)
    _say(f"rollout done: {len(plans)} board(s) serve {args.alias} from {args.package}")
    return EXIT_OK


def _stopped(plans: list[BoardPlan], number: int, failure: str) -> int:
    untouched = [p.target for p in plans[number:]]
    rest = f"; not touched: {', '.join(untouched)}" if untouched else ""
    return problem(f"rollout stopped at board {number} of {len(plans)}, {plans[number - 1].label}: {failure}{rest}")


def _board_say(number: int, total: int, plan: BoardPlan) -> Callable[[str], None]:
    def say(text: str) -> None:
        _say(f"[{number}/{total}] {plan.label}: {text}")

    return say


def _say(text: str) -> None:
    print(text, flush=True)


def _gateway_rejoin(gateway: Gateway, args: argparse.Namespace) -> Rejoin:
    """Wait until the gateway routes the alias to as many boards as before the rollout."""
    expected = gateway.ready_boards(args.alias)

    def rejoined(_: DaemonClient) -> str:
        seen = _poll(lambda: gateway.ready_boards(args.alias), lambda n: n >= expected, args.rejoin_timeout)
        return f"the gateway routes {args.alias} to {seen} board(s) again"

    return rejoined


def _daemon_rejoin(args: argparse.Namespace) -> Rejoin:
    """Wait until the daemon reports the board SERVING with the alias ready."""

    def rejoined(client: DaemonClient) -> str:
        def serving() -> bool:
            health = client.health()
            ready = any(m.alias == args.alias and m.status == common_pb2.SERVING_STATUS_SERVING for m in health.models)
            return health.status == common_pb2.SERVING_STATUS_SERVING and ready

        _poll(serving, bool, args.rejoin_timeout)
        return f"serving {args.alias} again"

    return rejoined


def _poll(read: Callable[[], T], done: Callable[[T], bool], timeout_s: float) -> T:
    """`read()` every POLL_S seconds until `done(value)`; returns that value. An error of `read`
    counts as not done yet (a gateway restarting, a board reconnecting) and is reported at the end.

    Raises:
        Unavailable: not done within `timeout_s` (the message has the last value or error).
    """
    deadline = time.monotonic() + timeout_s
    last = "nothing read"
    while True:
        try:
            value = read()
            if done(value):
                return value
            last = f"last read {value!r}"
        except CalculetError as err:
            last = f"last error {err.kind.value}: {err}"
        if time.monotonic() >= deadline:
            raise Unavailable(f"not within {timeout_s:g} s ({last})")
        time.sleep(POLL_S)
