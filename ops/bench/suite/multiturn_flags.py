"""The multi-turn comparison's flags of `calctl bench suite` (`--multiturn`), their defaults, and the
matrix flags it does not take.

`add_arguments(parser)` adds the group; every flag defaults to None, so `given` can tell a flag given
from a default, and `sizes_from(args)` applies the issue-19 defaults below. `foreign(args)` lists the
matrix's flags given with `--multiturn`; the command turns both lists into usage errors (exit 2).
`--daemon-arg` / `--gateway-arg` pass extra flags to the fleets (as `calctl up`'s do), refusing the
ones the comparison sets itself (`--prefix-reuse`, `--routing`) and the fleet's own.
"""

from __future__ import annotations

import argparse

from calculet.common.errors import InvalidArgument
from calculet.ops.bench.arg_types import count_arg, positive_arg, typed_arg
from calculet.ops.bench.multiturn.workload import ThinkTime
from calculet.ops.bench.slo import Slo
from calculet.ops.bench.suite.multiturn import MultiturnSizes
from calculet.ops.commands.up import DAEMON_OWN_FLAGS, GATEWAY_OWN_FLAGS, extra_args

DEFAULT_BOARDS = (1, 4)
DEFAULT_USERS_PER_LANE = 0.75
DEFAULT_TURNS = 5
DEFAULT_SYSTEM_TOKENS = 1000
DEFAULT_USER_TOKENS = 100
DEFAULT_ANSWER_TOKENS = 100
DEFAULT_THINK = "0.5:1.5"
MAX_BOARDS = 16

# dest -> flag, of the multi-turn group (besides --multiturn itself)
MULTITURN_FLAGS = {
    "boards": "--boards",
    "users_per_lane": "--users-per-lane",
    "turns": "--turns",
    "system_tokens": "--system-tokens",
    "user_tokens": "--user-tokens",
    "answer_tokens": "--answer-tokens",
    "think_time": "--think-time",
    "daemon_arg": "--daemon-arg",
    "gateway_arg": "--gateway-arg",
}
# dest -> flag, of the matrix, which the comparison does not take
MATRIX_FLAGS = {
    "quick": "--quick",
    "workloads": "--workloads",
    "targets": "--targets",
    "concurrency": "--concurrency",
    "requests": "--requests",
}


def parse_boards(text: str) -> tuple[int, ...]:
    """`1,4` -> (1, 4): distinct fleet sizes in 1..MAX_BOARDS, in the order given.

    Raises:
        InvalidArgument: anything else.
    """
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise InvalidArgument(f"{text!r}: expected board counts separated by commas") from None
    if any(not 1 <= v <= MAX_BOARDS for v in values):
        raise InvalidArgument(f"{text!r}: every board count must be in 1..{MAX_BOARDS}")
    if len(set(values)) != len(values):
        raise InvalidArgument(f"{text!r}: a board count is given twice")
    return values


def parse_slo(text: str) -> str:
    """The `--slo` text, checked as `calctl bench` will parse it. Raises InvalidArgument."""
    Slo.parse(text)
    return text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("the multi-turn comparison of issue 19 (--multiturn)")
    multiturn_help = "run the multi-turn comparison (prefix reuse off/on, load/prefix routing) instead of the matrix"
    group.add_argument("--multiturn", action="store_true", help=multiturn_help)
    boards_help = f"fleet sizes ({','.join(map(str, DEFAULT_BOARDS))})"
    group.add_argument("--boards", type=typed_arg(parse_boards), metavar="B,..", help=boards_help)
    users_help = f"conversations per KV lane of each fleet ({DEFAULT_USERS_PER_LANE})"
    group.add_argument("--users-per-lane", type=positive_arg(allow_inf=False), metavar="F", help=users_help)
    group.add_argument("--turns", type=count_arg(1), metavar="N", help=f"turns per user ({DEFAULT_TURNS})")
    system_help = f"tokens of the shared system prompt ({DEFAULT_SYSTEM_TOKENS})"
    group.add_argument("--system-tokens", type=count_arg(0), metavar="S", help=system_help)
    user_help = f"tokens of each user message ({DEFAULT_USER_TOKENS})"
    group.add_argument("--user-tokens", type=count_arg(1), metavar="U", help=user_help)
    answer_help = f"tokens of each answer ({DEFAULT_ANSWER_TOKENS})"
    group.add_argument("--answer-tokens", type=count_arg(1), metavar="A", help=answer_help)
    think_help = f"seconds between an answer and the next message ({DEFAULT_THINK})"
    group.add_argument("--think-time", type=typed_arg(ThinkTime.parse), metavar="S|LO:HI", help=think_help)
    slo_help = "goodput objectives of every run, as calctl bench's (none)"
    group.add_argument("--slo", type=typed_arg(parse_slo), metavar="ttft:MS,tpot:MS", help=slo_help)
    daemon_own = (*DAEMON_OWN_FLAGS, "--prefix-reuse")
    group.add_argument(
        "--daemon-arg", type=extra_args("daemon", daemon_own), action="append", metavar="FLAGS",
        help="extra flags for every daemon, shell-split, repeatable (e.g. '--prefill-chunk-tokens off')",
    )  # fmt: skip
    gateway_own = (*GATEWAY_OWN_FLAGS, "--routing")
    group.add_argument(
        "--gateway-arg", type=extra_args("gateway", gateway_own), action="append", metavar="FLAGS",
        help="extra flags for every gateway, shell-split, repeatable",
    )  # fmt: skip


def given(args: argparse.Namespace) -> list[str]:
    """The multi-turn flags on the command line."""
    return [flag for dest, flag in MULTITURN_FLAGS.items() if getattr(args, dest, None) is not None]


def foreign(args: argparse.Namespace) -> list[str]:
    """The matrix flags on the command line (the comparison refuses them)."""
    return [flag for dest, flag in MATRIX_FLAGS.items() if getattr(args, dest, None) not in (None, False)]


def sizes_from(args: argparse.Namespace) -> MultiturnSizes:
    """The comparison's sizes, defaults applied. Raises InvalidArgument: see `MultiturnSizes`."""

    def pick(value: int | None, default: int) -> int:
        return default if value is None else value

    return MultiturnSizes(
        users_per_lane=args.users_per_lane or DEFAULT_USERS_PER_LANE,
        turns=pick(args.turns, DEFAULT_TURNS),
        system_tokens=pick(args.system_tokens, DEFAULT_SYSTEM_TOKENS),
        user_tokens=pick(args.user_tokens, DEFAULT_USER_TOKENS),
        answer_tokens=pick(args.answer_tokens, DEFAULT_ANSWER_TOKENS),
        think=args.think_time or ThinkTime.parse(DEFAULT_THINK),
    )


def extra(values: list[tuple[str, ...]] | None) -> tuple[str, ...]:
    """The words of repeated `--daemon-arg` / `--gateway-arg` values, in order."""
    return tuple(word for words in values or () for word in words)
