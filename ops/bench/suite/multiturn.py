"""The suite's multi-turn comparison (issue 19, `calctl bench suite --multiturn`): which fleets run the
multi-turn workload, with which prefix reuse and routing, and at which sizes.

A `ComparisonFleet` is a local fleet of `boards` continuous-batching daemons (in-flight 2) on the
suite's largest-batch package, started with `--prefix-reuse on|off`, behind a gateway started with
`--routing load|prefix`. `comparison_fleets(boards)`: for each fleet size, reuse off and on; on
more than one board, reuse on twice, with load-only routing and with prefix+cost routing (one
board never consults the router, so a one-board fleet runs load routing only). Names:
`mt-x<boards>-<reuse>-<routing>`.

`MultiturnSizes` are the workload's sizes (the issue's defaults: a 1,000-token system prompt, 5
turns of 100 user tokens and 100-token answers, a short think time) and the users per lane: every
fleet runs `users_for(lanes, boards)` = round(users_per_lane x lanes x boards) conversations, at
least one, so fleets of different sizes compare at the same load per board.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from calculet.common.errors import InvalidArgument
from calculet.ops.bench.limit import Policy
from calculet.ops.bench.multiturn.workload import ThinkTime
from calculet.ops.bench.suite.matrix import FleetSpec

REUSE_MODES = ("off", "on")
LOAD, PREFIX = "load", "prefix"
WORKLOAD = "multiturn"
# ChatML wraps a message in about this many tokens (`<|im_start|>role\n ... <|im_end|>\n`): what the
# estimates add per message (the measured prompt tokens are the server's).
TEMPLATE_TOKENS_PER_MESSAGE = 5


@dataclass(frozen=True)
class ComparisonFleet:
    """One fleet of the comparison (module docstring)."""

    boards: int
    reuse: bool
    routing: str

    @property
    def name(self) -> str:
        return f"mt-x{self.boards}-{'on' if self.reuse else 'off'}-{self.routing}"

    def spec(self, decode_batch: int) -> FleetSpec:
        """The matrix's view of it (for `suite.fleet`): continuous, in-flight 2, the given batch."""
        return FleetSpec(self.name, Policy.CONTINUOUS, 2, decode_batch, self.boards)

    def daemon_flags(self) -> tuple[str, ...]:
        return ("--prefix-reuse", "on" if self.reuse else "off")

    def gateway_flags(self) -> tuple[str, ...]:
        return ("--routing", self.routing)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "boards": self.boards, "prefix_reuse": self.reuse, "routing": self.routing}


def comparison_fleets(boards: Sequence[int]) -> tuple[ComparisonFleet, ...]:
    """The fleets for each size in `boards`, in order (module docstring)."""
    out = []
    for b in boards:
        out += [ComparisonFleet(b, False, LOAD), ComparisonFleet(b, True, LOAD)]
        if b > 1:
            out.append(ComparisonFleet(b, True, PREFIX))
    return tuple(out)


def select(fleets: Sequence[ComparisonFleet], names: frozenset[str] | None) -> tuple[ComparisonFleet, ...]:
    """The fleets named (all when None).

    Raises:
        InvalidArgument: a name that is not a fleet of the comparison (the message lists them).
    """
    if names is None:
        return tuple(fleets)
    known = [f.name for f in fleets]
    unknown = sorted(names - set(known))
    if unknown:
        raise InvalidArgument(f"unknown configuration {', '.join(unknown)} (this comparison has: {', '.join(known)})")
    return tuple(f for f in fleets if f.name in names)


@dataclass(frozen=True)
class MultiturnSizes:
    """The workload of every fleet of the comparison.

    Attributes:
        users_per_lane: conversations per KV lane of the fleet.
        turns, system_tokens, user_tokens, answer_tokens, think: as `MultiturnSpec`.
    """

    users_per_lane: float
    turns: int
    system_tokens: int
    user_tokens: int
    answer_tokens: int
    think: ThinkTime

    def __post_init__(self) -> None:
        if not self.users_per_lane > 0 or self.turns < 1 or self.user_tokens < 1 or self.answer_tokens < 1:
            raise InvalidArgument("users per lane, turns, user and answer tokens: must be > 0")
        if self.system_tokens < 0:
            raise InvalidArgument("system tokens: must be >= 0")

    def users_for(self, lanes: int, boards: int) -> int:
        return max(1, round(self.users_per_lane * lanes * boards))

    def prompt_tokens(self, turn: int) -> int:
        """About turn `turn`'s (1-based) prompt tokens: the system prompt, `turn` user messages and
        `turn - 1` answers, each wrapped by the template, and the template's generation prompt."""
        system = self.system_tokens + TEMPLATE_TOKENS_PER_MESSAGE if self.system_tokens else 0
        messages = turn * (self.user_tokens + TEMPLATE_TOKENS_PER_MESSAGE)
        answers = (turn - 1) * (self.answer_tokens + TEMPLATE_TOKENS_PER_MESSAGE)
        return system + messages + answers + TEMPLATE_TOKENS_PER_MESSAGE

    def check_fits(self, context: int) -> None:
        """Raises: InvalidArgument: the last turn's prompt and answer would not fit a lane's `context`."""
        need = self.prompt_tokens(self.turns) + self.answer_tokens
        if need > context:
            raise InvalidArgument(
                f"the last turn needs about {need} tokens (prompt and answer) but a lane of the package holds "
                f"{context}: fewer --turns or smaller --system-tokens / --user-tokens / --answer-tokens"
            )

    def describe(self) -> dict[str, Any]:
        return {
            "name": WORKLOAD,
            "users_per_lane": self.users_per_lane,
            "turns": self.turns,
            "system_tokens": self.system_tokens,
            "user_tokens": self.user_tokens,
            "answer_tokens": self.answer_tokens,
            "think_time_s": self.think.as_list(),
        }
