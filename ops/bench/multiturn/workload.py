"""The multi-turn workload: who says what, when (docs/benchmarking.md, "Multi-turn conversations").

Owns `ThinkTime` (`S` or `LO:HI` seconds), `MultiturnSpec` (users, turns, the system prompt's S
tokens, U tokens per user message, A answer tokens, think time, stagger, seed), `Conversation`
(one user: start offset, one message per turn, the think times between turns) and
`build_workload`. Every text is sized with the model's tokenizer (`text.sized_text`).

Determinism: each part has its own generator seeded from `--seed` and the part's name (the system
prompt; user u's messages; user u's think times; warm-up i), so the same seed and tokenizer give
the same workload, and a user's messages do not change with the number of users. Distinct users:
every message starts with lead word(s) unique to its (user, turn) pair (the pair's number written
in base `len(WORDS)`, a seeded permutation of the pool as digits), so the users' prompts differ
right after the shared system prompt.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

from calculet.common.errors import InvalidArgument
from calculet.ops.bench.multiturn.text import WORDS, SizedText, TokenCounter, sized_text


@dataclass(frozen=True)
class ThinkTime:
    """Seconds a user waits between an answer and the next message: fixed or uniform in low..high."""

    low: float
    high: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.low) and math.isfinite(self.high) and 0 <= self.low <= self.high):
            raise InvalidArgument(f"think time: expected 0 <= LO <= HI seconds, got {self.low}:{self.high}")

    @classmethod
    def parse(cls, text: str) -> ThinkTime:
        """`S` or `LO:HI` seconds, finite, 0 <= LO <= HI.

        Raises:
            InvalidArgument: anything else.
        """
        low_text, sep, high_text = text.partition(":")
        try:
            low = float(low_text)
            high = float(high_text) if sep else low
        except ValueError:
            raise InvalidArgument(f"{text!r}: expected S or LO:HI seconds") from None
        if not (math.isfinite(low) and math.isfinite(high) and 0 <= low <= high):
            raise InvalidArgument(f"{text!r}: expected finite seconds with 0 <= LO <= HI")
        return cls(low, high)

    def draw(self, rng: random.Random) -> float:
        return self.low if self.low == self.high else rng.uniform(self.low, self.high)

    def as_list(self) -> list[float]:
        return [self.low, self.high]


@dataclass(frozen=True)
class MultiturnSpec:
    """What to build.

    Attributes:
        users: conversations run at once.
        turns: messages per user (each answered before the next).
        system_tokens: the shared system prompt's tokens (0: no system message).
        user_tokens: tokens of each user message.
        answer_tokens: `max_tokens` of each turn (exactly that many with `ignore_eos`).
        think: the wait between an answer and the user's next message.
        stagger_s: user u starts u * stagger_s seconds after the first.
        seed: every generator's seed.
    """

    users: int
    turns: int
    system_tokens: int
    user_tokens: int
    answer_tokens: int
    think: ThinkTime
    stagger_s: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.users < 1 or self.turns < 1 or self.user_tokens < 1 or self.answer_tokens < 1:
            raise InvalidArgument("users, turns, user tokens and answer tokens: must be at least 1")
        if self.system_tokens < 0 or not (math.isfinite(self.stagger_s) and self.stagger_s >= 0):
            raise InvalidArgument("system tokens and stagger: must be >= 0")

    def stream(self, part: str) -> random.Random:
        """The generator of one part of the workload (module docstring)."""
        return random.Random(f"calctl-bench:{self.seed}:multiturn:{part}")


@dataclass(frozen=True)
class Conversation:
    """One user's side of a conversation.

    Attributes:
        user: its number, 0-based.
        start_s: when its first message is sent, after the run starts.
        messages: one per turn.
        think_s: the waits after turns 1 .. turns-1.
    """

    user: int
    start_s: float
    messages: tuple[SizedText, ...]
    think_s: tuple[float, ...]


@dataclass(frozen=True)
class MultiturnWorkload:
    """The built workload: the shared system prompt (None when S = 0), the conversations (by user),
    and the warm-up messages (one-turn chats of U tokens, without the system prompt)."""

    spec: MultiturnSpec
    system: SizedText | None
    conversations: tuple[Conversation, ...]
    warmup: tuple[SizedText, ...]

    def describe(self) -> dict[str, Any]:
        """The report's `config.workload`: the spec and the token counts the texts really have."""
        s = self.spec
        user_counts = [m.tokens for c in self.conversations for m in c.messages]
        return {
            "source": "multiturn",
            "users": s.users,
            "turns": s.turns,
            "system_tokens": s.system_tokens,
            "user_tokens": s.user_tokens,
            "answer_tokens": s.answer_tokens,
            "think_time_s": s.think.as_list(),
            "stagger_s": s.stagger_s,
            "measured_tokens": {
                "system": self.system.tokens if self.system is not None else 0,
                "user_min": min(user_counts),
                "user_max": max(user_counts),
            },
        }


def user_lead(user: int, turn: int, spec: MultiturnSpec) -> list[str]:
    """The words user `user`'s message of `turn` (1-based) starts with: distinct per (user, turn)
    pair (the pair's index written in base len(WORDS), digits from a seeded permutation)."""
    digits = list(WORDS)
    spec.stream("leads").shuffle(digits)
    number = user * spec.turns + (turn - 1)
    out = [digits[number % len(digits)]]
    number //= len(digits)
    while number:
        out.append(digits[number % len(digits)])
        number //= len(digits)
    return out


def build_workload(spec: MultiturnSpec, count: TokenCounter, warmup: int = 0) -> MultiturnWorkload:
    """Every text, think time and start offset of the run (module docstring).

    Args:
        spec: the parameters.
        count: the model's token counter.
        warmup: warm-up chats to build.

    Raises:
        InvalidArgument: a negative warm-up count.
    """
    if warmup < 0:
        raise InvalidArgument(f"warm-up: must be >= 0, got {warmup}")
    system = sized_text(spec.system_tokens, count, spec.stream("system")) if spec.system_tokens else None
    conversations = []
    for user in range(spec.users):
        words = spec.stream(f"user:{user}")
        messages = tuple(
            sized_text(spec.user_tokens, count, words, lead=user_lead(user, turn, spec))
            for turn in range(1, spec.turns + 1)
        )
        thinking = spec.stream(f"think:{user}")
        think = tuple(spec.think.draw(thinking) for _ in range(spec.turns - 1))
        conversations.append(Conversation(user, user * spec.stagger_s, messages, think))
    warm = tuple(sized_text(spec.user_tokens, count, spec.stream(f"warmup:{i}")) for i in range(warmup))
    return MultiturnWorkload(spec, system, tuple(conversations), warm)
