"""The multi-turn workload's flags of `calctl bench` (`--workload multiturn`), their defaults, and
which of the command's other flags do not apply to it.

`add_arguments(parser)` adds the group; every flag defaults to None (so `given` can tell a flag
given from a default) and `spec_from(args)` applies the defaults below. `given(args)` lists the
multi-turn flags on the command line, `foreign(args)` the independent-request flags that a
multi-turn run refuses; the command turns both into usage errors (exit 2).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from calculet.ops.bench.arg_types import count_arg, non_negative_arg, typed_arg
from calculet.ops.bench.multiturn.workload import MultiturnSpec, ThinkTime

DEFAULT_USERS = 8
DEFAULT_TURNS = 5
DEFAULT_SYSTEM_TOKENS = 1000
DEFAULT_USER_TOKENS = 100
DEFAULT_ANSWER_TOKENS = 100
DEFAULT_THINK = "0.5:1.5"

# dest -> flag of the multi-turn group
MULTITURN_FLAGS = {
    "users": "--users",
    "turns": "--turns",
    "system_tokens": "--system-tokens",
    "user_tokens": "--user-tokens",
    "answer_tokens": "--answer-tokens",
    "think_time": "--think-time",
    "stagger": "--stagger",
    "send_user": "--send-user",
    "tokenizer": "--tokenizer",
}
# dest -> flag of the independent-request workload, which a multi-turn run does not take
REQUEST_FLAGS = {
    "concurrency": "--concurrency",
    "rate": "--rate",
    "burstiness": "--burstiness",
    "requests": "--requests",
    "prompt_len": "--prompt-len",
    "output_len": "--output-len",
    "prompts": "--prompts",
    "vocab": "--vocab",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("multi-turn workload (--workload multiturn, through --gateway)")
    group.add_argument("--users", type=count_arg(1), metavar="N", help=f"conversations at once ({DEFAULT_USERS})")
    group.add_argument("--turns", type=count_arg(1), metavar="N", help=f"messages per user ({DEFAULT_TURNS})")
    system_help = f"tokens of the shared system prompt, 0 = none ({DEFAULT_SYSTEM_TOKENS})"
    group.add_argument("--system-tokens", type=count_arg(0), metavar="S", help=system_help)
    user_help = f"tokens of each user message ({DEFAULT_USER_TOKENS})"
    group.add_argument("--user-tokens", type=count_arg(1), metavar="U", help=user_help)
    answer_help = f"tokens of each answer, max_tokens with ignore_eos ({DEFAULT_ANSWER_TOKENS})"
    group.add_argument("--answer-tokens", type=count_arg(1), metavar="A", help=answer_help)
    think_help = f"seconds between an answer and the next message, fixed or uniform ({DEFAULT_THINK})"
    group.add_argument("--think-time", type=typed_arg(ThinkTime.parse), metavar="S|LO:HI", help=think_help)
    stagger_help = "user u starts u x S seconds after the first (0)"
    group.add_argument("--stagger", type=non_negative_arg, metavar="S", help=stagger_help)
    user_help = "send OpenAI's user per conversation (the gateway's session affinity key)"
    group.add_argument("--send-user", action="store_true", default=None, help=user_help)
    tokenizer_help = "the model's tokenizer.json (default: from the first board's GetModel)"
    group.add_argument("--tokenizer", type=Path, metavar="FILE", help=tokenizer_help)


def given(args: argparse.Namespace) -> list[str]:
    """The multi-turn flags given on the command line."""
    return [flag for dest, flag in MULTITURN_FLAGS.items() if getattr(args, dest, None) is not None]


def foreign(args: argparse.Namespace) -> list[str]:
    """The independent-request flags given on the command line (a multi-turn run refuses them)."""
    return [flag for dest, flag in REQUEST_FLAGS.items() if getattr(args, dest, None) is not None]


def spec_from(args: argparse.Namespace) -> MultiturnSpec:
    """The spec of these flags, defaults applied.

    Raises:
        InvalidArgument: see `MultiturnSpec`.
    """

    def pick(value: int | None, default: int) -> int:
        return default if value is None else value

    return MultiturnSpec(
        users=pick(args.users, DEFAULT_USERS),
        turns=pick(args.turns, DEFAULT_TURNS),
        system_tokens=pick(args.system_tokens, DEFAULT_SYSTEM_TOKENS),
        user_tokens=pick(args.user_tokens, DEFAULT_USER_TOKENS),
        answer_tokens=pick(args.answer_tokens, DEFAULT_ANSWER_TOKENS),
        think=args.think_time or ThinkTime.parse(DEFAULT_THINK),
        stagger_s=args.stagger or 0.0,
        seed=args.seed,
    )
