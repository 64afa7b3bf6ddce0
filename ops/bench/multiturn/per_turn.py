"""Figures by turn number, from the turns' records: pure functions, no clock, no I/O.

For turn k (1-based), over the users' turn-k requests:

- `sent`, `completed`, `failed`; `skipped` = users - sent (a conversation ends at a failed turn);
- `prompt_tokens`, `cached_tokens`, `output_tokens`: sums over the completed requests (the server's
  usage: `prompt_tokens`, `prompt_tokens_details.cached_tokens` (absent = 0), `completion_tokens`);
- `cached_share` = cached / prompt tokens (None without a completed request);
- `carried_tokens`: for each completed turn-k request whose user's turn k-1 completed,
  min(prompt_k, prompt_{k-1} + output_{k-1}): what the previous turn left in its lane, the most
  per-lane reuse can serve if the history re-tokenises to the same tokens; `carried_share` over
  the prompt tokens (0 on turn 1);
- `missed`: completed turn-k requests whose user's turn k-1 completed and whose cached tokens fall
  short of that turn's prompt in full 64-token blocks: what the lane it left holds of the new
  prompt whatever the answer re-renders to, so a turn below it was served away from that lane
  (another board, or the lane was evicted);
- `ttft`: TTFT distribution (`LatencyStats`, seconds) of the completed requests.

`cached_share(turns, first_turn)` is the share over every completed request of turn >= first_turn.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from calculet.common.prefix import BLOCK_TOKENS
from calculet.ops.bench.latency import request_latency
from calculet.ops.bench.multiturn.turns import TurnRecord
from calculet.ops.bench.summary import LatencyStats


@dataclass(frozen=True)
class TurnStats:
    """One turn number's figures (module docstring)."""

    turn: int
    sent: int
    completed: int
    failed: int
    skipped: int
    prompt_tokens: int
    cached_tokens: int
    carried_tokens: int
    output_tokens: int
    ttft: LatencyStats
    missed: int = 0

    @property
    def cached_share(self) -> float | None:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else None

    @property
    def carried_share(self) -> float | None:
        return self.carried_tokens / self.prompt_tokens if self.prompt_tokens else None


def _carried(record: TurnRecord, previous: TurnRecord | None) -> int:
    if previous is None or not previous.ok or previous.record.prompt_tokens is None:
        return 0
    prompt = record.record.prompt_tokens or 0
    return min(prompt, previous.record.prompt_tokens + previous.record.output_tokens)


def _missed(record: TurnRecord, previous: TurnRecord | None) -> bool:
    if previous is None or not previous.ok or previous.record.prompt_tokens is None:
        return False
    held = previous.record.prompt_tokens // BLOCK_TOKENS * BLOCK_TOKENS
    return record.cached_tokens < held


def turn_stats(turns: Sequence[TurnRecord], users: int, turns_per_user: int) -> list[TurnStats]:
    """The figures of turns 1 .. `turns_per_user` (module docstring).

    Args:
        turns: the measured records (any order).
        users: the conversations of the run (for `skipped`).
        turns_per_user: turns each conversation was to have.
    """
    by_key = {(t.user, t.turn): t for t in turns}
    out = []
    for k in range(1, turns_per_user + 1):
        these = [t for t in turns if t.turn == k]
        done = [t for t in these if t.ok]
        out.append(
            TurnStats(
                turn=k,
                sent=len(these),
                completed=len(done),
                failed=len(these) - len(done),
                skipped=users - len(these),
                prompt_tokens=sum(t.record.prompt_tokens or 0 for t in done),
                cached_tokens=sum(t.cached_tokens for t in done),
                carried_tokens=sum(_carried(t, by_key.get((t.user, k - 1))) for t in done),
                output_tokens=sum(t.record.output_tokens for t in done),
                ttft=LatencyStats.of([request_latency(t.record).ttft for t in done]),
                missed=sum(_missed(t, by_key.get((t.user, k - 1))) for t in done),
            )
        )
    return out


def cached_share(turns: Sequence[TurnRecord], first_turn: int = 1) -> float | None:
    """Cached over prompt tokens of the completed requests of turn >= `first_turn` (None: none)."""
    done = [t for t in turns if t.ok and t.turn >= first_turn]
    prompt = sum(t.record.prompt_tokens or 0 for t in done)
    return sum(t.cached_tokens for t in done) / prompt if prompt else None
