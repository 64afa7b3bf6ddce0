"""A request's thinking budget and the per-sequence tracker that enforces it (docs/daemon.md
"Thinking budget").

`ThinkingBudget` is plain data carried by `SamplingParams.thinking`: the ids of the think-open and
think-close tokens (the caller resolves them with the model's tokenizer) and the budget N. The
`ThinkingTracker` follows one sequence's tokens: once its think block holds N tokens without a
close, the next token is forced to be the close token instead of drawn.

A think block is one the prompt leaves open (its last open token comes after its last close token:
a chat template that opened the block in the generation prompt) or one the first generated token
opens (a model that starts with `<think>`); anything else is answer from the first token on. Only
one block is tracked: after the close every token is answer.

Ownership: a tracker belongs to its `ClientJob` (engine lock); `observe` is called only when a token
is accepted, so a lost or cancelled step never advances it.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum, auto

from calculet.common.errors import InvalidArgument
from calculet.common.lifecycle import Lifecycle, table

MAX_THINKING_BUDGET = 2**31 - 1  # any budget fits: max_tokens (<= the context) bounds it anyway


@dataclass(frozen=True, slots=True)
class ThinkingBudget:
    """At most `budget` tokens between `open_token` and `close_token`; then the close is forced.

    Raises (on construction):
        InvalidArgument: a field is not an integer in range, or the two ids are equal; the
            message names the field (`thinking.budget`, `thinking.open_token_id`, ...).
    """

    budget: int
    open_token: int
    close_token: int

    def __post_init__(self) -> None:
        _integer("thinking.budget", self.budget, MAX_THINKING_BUDGET)
        _integer("thinking.open_token_id", self.open_token, 2**32 - 1)
        _integer("thinking.close_token_id", self.close_token, 2**32 - 1)
        if self.open_token == self.close_token:
            raise InvalidArgument(f"thinking.close_token_id: must differ from open_token_id, both {self.open_token}")

    def validate(self, vocab_size: int) -> None:
        """Raises InvalidArgument when a token id is outside the vocabulary."""
        for name, token in (("open_token_id", self.open_token), ("close_token_id", self.close_token)):
            if token >= vocab_size:
                raise InvalidArgument(f"thinking.{name}: token id {token} outside the vocabulary [0, {vocab_size})")


class ThinkPhase(Enum):
    PENDING = auto()  # nothing generated yet, no block open: the first token may open one
    THINKING = auto()  # inside the block: tokens count against the budget
    ANSWER = auto()  # after the close (or no block at all): the constraint, if any, applies


THINK_TRANSITIONS = table(
    [
        (ThinkPhase.PENDING, [ThinkPhase.THINKING, ThinkPhase.ANSWER]),
        (ThinkPhase.THINKING, [ThinkPhase.ANSWER]),
    ]
)


class ThinkingTracker:
    """Where one sequence is relative to its think block, and how many thinking tokens it has."""

    def __init__(self, budget: ThinkingBudget, prompt: Sequence[int], name: str) -> None:
        self.budget = budget
        self.count = 0  # tokens inside the block so far (neither marker counted)
        initial = ThinkPhase.THINKING if _open_at_end(prompt, budget) else ThinkPhase.PENDING
        self.lifecycle: Lifecycle[ThinkPhase] = Lifecycle(f"thinking of {name}", initial, THINK_TRANSITIONS)

    @property
    def phase(self) -> ThinkPhase:
        return self.lifecycle.state

    def forced_next(self) -> int | None:
        """The token the next step must produce (the close token once the budget is used), else None."""
        if self.phase is ThinkPhase.THINKING and self.count >= self.budget.budget:
            return self.budget.close_token
        return None

    def is_answer(self, token: int) -> bool:
        """Whether `token`, produced next, belongs to the answer (the constraint's text); no change."""
        phase = self.phase
        return phase is ThinkPhase.ANSWER or (phase is ThinkPhase.PENDING and token != self.budget.open_token)

    def observe(self, token: int) -> None:
        """Advance past an accepted token (drawn, forced or resumed)."""
        phase = self.phase
        if phase is ThinkPhase.PENDING:
            self.lifecycle.move(ThinkPhase.THINKING if token == self.budget.open_token else ThinkPhase.ANSWER)
        elif phase is ThinkPhase.THINKING:
            if token == self.budget.close_token:
                self.lifecycle.move(ThinkPhase.ANSWER)
            else:
                self.count += 1

    def replay(self, tokens: Sequence[int]) -> int:
        """Observe a resumed request's tokens; returns the index of its first answer token
        (`len(tokens)` if none is), so the constraint's matcher replays only the answer.

        Raises:
            InvalidArgument: `resume_tokens[i]` is not the close where the budget forces it: no
                undisturbed run of this request produced these tokens (as a resumed stop token).
        """
        first_answer = len(tokens)
        for i, token in enumerate(tokens):
            forced = self.forced_next()
            if forced is not None and token != forced:
                raise InvalidArgument(
                    f"resume_tokens[{i}]: the thinking budget forces the close token {forced} there, got {token}"
                )
            if first_answer == len(tokens) and self.is_answer(token):
                first_answer = i
            self.observe(token)
        return first_answer


def _open_at_end(prompt: Sequence[int], budget: ThinkingBudget) -> bool:
    """The prompt's last think marker is an open one (scanned from the end; O(prompt) when it has none)."""
    for token in reversed(prompt):
        if token == budget.open_token:
            return True
        if token == budget.close_token:
            return False
    return False


def _integer(name: str, value: object, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not 0 <= int(value) <= high:
        raise InvalidArgument(f"{name}: must be an integer in [0, {high}], got {value!r}")
