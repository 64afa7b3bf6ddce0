"""`BoardClaim`: one choice's claim on one board, from the pick to the end of its attempt there.

Why: a pick must count against its board before anything awaits, or a burst of requests all see
the same counts and land on the same board. `Router.place` chooses a board and creates the
claim in the same synchronous step; the claim counts one job and its uncached prompt
tokens (prefill work ahead of the next prompt) on the board at once.

Lifecycle (`CLAIM_TRANSITIONS`):
    PREFILLING  counts one job and `tokens` pending prefill tokens on the board
    STREAMING   the first token came (`first_token`): the prefill is done, it counts one job
    RELEASED    counts nothing (terminal): the choice ended, failed, was cancelled or moved on

Ownership: exactly one owner at a time. The service creates a request's placements and hands
each to its `ChoiceRunner`, which owns it from then on and releases it when the attempt on that
board ends however it ends (a failover releases it and places anew elsewhere). `release` is the
only way out of the counts and does its work once: a second call (a `finally` after an explicit
release) changes nothing, so no path can leak or double-release a count.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import TYPE_CHECKING

from calculet.common.lifecycle import Lifecycle, table

if TYPE_CHECKING:
    from calculet.gateway.fleet.board import Board


class ClaimState(Enum):
    PREFILLING = "prefilling"
    STREAMING = "streaming"
    RELEASED = "released"


CLAIM_TRANSITIONS = table(
    [
        (ClaimState.PREFILLING, [ClaimState.STREAMING, ClaimState.RELEASED]),
        (ClaimState.STREAMING, [ClaimState.RELEASED]),
    ]
)

OnRelease = Callable[["BoardClaim", bool], None]
"""Told once when a placement is released: (the placement, whether its choice completed there)."""


class BoardClaim:
    """A choice counted on `board` (see the module docstring).

    Args:
        board: where the choice goes; counted there now (one job, `tokens` pending tokens).
        alias: the model.
        tokens: prompt tokens the board is expected to prefill for it (its uncached tokens).
        placed_at: when it was placed (the caller's monotonic clock, seconds).
        on_release: told once at release (turnover, retiring boards, the pick-time prefix view).
        blocks: the block hashes of the prompt sent there (the router records them once the choice
            completes: `sent_prefixes.py`).
    """

    def __init__(
        self,
        board: Board,
        alias: str,
        tokens: int,
        placed_at: float,
        on_release: OnRelease,
        blocks: tuple[int, ...] = (),
    ) -> None:
        self.board = board
        self.alias = alias
        self.tokens = tokens
        self.placed_at = placed_at
        self.blocks = blocks
        self._on_release = on_release
        self.life = Lifecycle(f"placement on {board.target}", ClaimState.PREFILLING, CLAIM_TRANSITIONS)
        bound = board.short_bound(alias)
        self.short = bool(bound) and tokens <= bound  # a short prefill there: counted as such until released
        board.count_placement(tokens, self.short)

    @property
    def state(self) -> ClaimState:
        return self.life.state

    def first_token(self) -> None:
        """The choice's first token arrived there: its tokens leave the board's pending prefill
        work. Later calls (every further chunk) change nothing; so does a call after release."""
        if self.state is ClaimState.PREFILLING:
            self.life.move(ClaimState.STREAMING)
            self.board.count_first_token(self.tokens, self.short)

    def release(self, *, completed: bool = False) -> None:
        """Uncount the choice from its board, once; later calls change nothing.

        Args:
            completed: the choice ended there normally (its duration is a lane turnover sample).
        """
        if self.state is ClaimState.RELEASED:
            return
        pending = self.tokens if self.state is ClaimState.PREFILLING else 0
        self.life.move(ClaimState.RELEASED)
        self.board.uncount_placement(pending, self.short)
        self._on_release(self, completed)

    def __repr__(self) -> str:
        return f"BoardClaim({self.board.target}, {self.alias}, {self.tokens} tokens, {self.state.value})"
