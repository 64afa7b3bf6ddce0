"""Which lane a new sequence takes: the prefix matcher and the eviction order (DESIGN.md "Prefix
reuse, per lane"; seed 001 section 9 P0.4, seed 000 section 7).

A parked lane holds a finished job's KV for a known token history. KV is never copied or shifted
between lanes, so reuse is per lane: a new sequence either takes a parked lane whose history starts
like its own tokens (its KV is truncated to the common prefix, a tail deletion, and only the rest is
prefilled) or takes a lane cold.

`choose_lane` is a pure function of the sequence's tokens, the parked lanes and the FREE lanes. Its
order, cheapest loss first:

1. **Continuation**: the parked lane sharing the longest prefix with the sequence (at least
   `min_tokens`) among those that lose less than `CONTINUATION_LOSS_TOKENS` of their history by the
   truncation: the next turn of the conversation the lane holds (the loss is what the chat template
   re-renders differently, or the unsampled last token).
2. **A FREE lane** (lowest index): while capacity is free, a warm conversation is never truncated to
   serve a stranger that merely shares its system prompt (its own next turn would lose its history).
3. **Eviction of the least recently used parked lane**: some parked lane must go, and, as in any
   cache, the one idle longest is the least likely to be continued. If its history shares at least
   `min_tokens` with the sequence (a system prompt), that prefix is kept (a tail deletion of the lane
   being evicted anyway); otherwise it is emptied (KV Free, then Apply). A more recent conversation
   is never truncated for a stranger's sake, however much they share: that would trade its next
   turn, likely soon, for a saving now.

The matched length is capped at `len(tokens) - 1`, so at least one token is prefilled and yields
the logits of the first new token.
"""

from __future__ import annotations

from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from enum import Enum

import numpy as np

CONTINUATION_LOSS_TOKENS = 64
"""A match that truncates away fewer tokens of a parked lane's history than this is its continuation."""


class LaneSource(Enum):
    """How `choose_lane` found the lane."""

    HIT = "hit"  # a parked lane the sequence continues: its KV prefix is kept
    FREE = "free"  # a FREE lane, empty
    EVICTED = "evicted"  # the least recently used parked lane, given to this sequence: emptied (its
    # device lane closed and reopened), or, with `keep` > 0, truncated to the prefix they share


@dataclass(frozen=True)
class ParkedView:
    """What the matcher needs of one parked lane.

    Attributes:
        tokens: the token history its KV holds, in position order (int32).
        last_used: when it was parked or last matched, in the manager's tick order (LRU).
    """

    lane: int
    tokens: np.ndarray
    last_used: int


@dataclass(frozen=True)
class LaneChoice:
    """The lane a sequence takes and the KV tokens it keeps there (0 unless HIT)."""

    lane: int
    source: LaneSource
    keep: int = 0


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the longest common prefix of two int arrays (vectorised)."""
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else n


def choose_lane(
    tokens: np.ndarray | None, parked: Sequence[ParkedView], free: AbstractSet[int], min_tokens: int
) -> LaneChoice | None:
    """The lane a new sequence takes (see the module docstring for the order).

    Args:
        tokens: the sequence's prefill tokens (prompt + resumed), or None to take a lane cold
            (prefix reuse off, a warm-up probe, a recovery).
        parked: the parked lanes of the sequence's generation.
        free: the FREE lanes.
        min_tokens: the shortest match worth a parked lane (>= 1).

    Returns:
        The choice, or None when no lane is FREE or PARKED.
    """
    hits: list[tuple[int, int, ParkedView]] = []  # (kept tokens, tokens lost, lane)
    if tokens is not None and len(tokens) > 1:
        for p in parked:
            keep = min(common_prefix(tokens, p.tokens), len(tokens) - 1)
            if keep >= max(1, min_tokens):
                hits.append((keep, len(p.tokens) - keep, p))
    continuations = [h for h in hits if h[1] < CONTINUATION_LOSS_TOKENS]
    if continuations:
        keep, _, p = max(continuations, key=lambda h: (h[0], -h[2].lane))
        return LaneChoice(p.lane, LaneSource.HIT, keep)
    if free:
        return LaneChoice(min(free), LaneSource.FREE)
    if not parked:
        return None
    oldest = min(parked, key=lambda p: (p.last_used, p.lane))
    shared = next((keep for keep, _, p in hits if p is oldest), 0)
    return LaneChoice(oldest.lane, LaneSource.EVICTED, shared)
