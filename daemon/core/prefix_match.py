"""Which lane a new sequence takes: the prefix matcher and the eviction order (docs/daemon.md,
"Conversations: prefix reuse and chunked prefill"; docs/sources.md 001 §9 P0.4, 000 §7).

A parked lane holds a finished job's KV for a known token history. KV is never copied or shifted
between lanes, so reuse is per lane: a new sequence either takes a parked lane whose history starts
like its own tokens (its KV is truncated to the common prefix, a tail deletion, and only the rest is
prefilled) or takes a lane cold.

`choose_lane` is a pure function of the sequence's tokens, the parked lanes and the FREE lanes. Its
order, cheapest loss first:

1. **Continuation**: the parked lane sharing the longest prefix with the sequence (at least
   `min_tokens`) among those whose whole prompt the sequence resends (the prompt of the job that
   parked it, its client's own turn included) and that lose less than `CONTINUATION_LOSS_TOKENS` of
   their history by the truncation: the next turn of the conversation the lane holds. The loss then
   lies in the lane's reply: what the chat template re-renders differently, or the unsampled last
   token.
2. **A FREE lane** (lowest index): while capacity is free, a warm conversation is never truncated to
   serve a stranger that merely shares its system prompt (its own next turn would lose its history).
   A stranger diverges inside the conversation's prompt, so it is never a continuation, however
   short the conversation's own part past the system prompt (docs/daemon.md, "Matching").
3. **Eviction of the least recently used parked lane**: some parked lane must go, and, as in any
   cache, the one idle longest is the least likely to be continued. If its history shares at least
   `min_tokens` with the sequence (a system prompt), that prefix is kept (a tail deletion of the lane
   being evicted anyway); otherwise it is emptied (KV Free, then Apply). A more recent conversation
   is never truncated for a stranger's sake, however much they share: that would trade its next
   turn, likely soon, for a saving now.

With fixed slots (a device without lane selection, `device/slots.py`) rules 2 and 3 give way to
**the lowest slot**, FREE or PARKED (a parked one evicted as in rule 3): there a slot's position is
paid on every decode step (the batch covers the highest occupied slot), while a parked lane only
saves a re-prefill if its conversation comes back. Continuations (rule 1) stay first.

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
        prompt_len: how many of `tokens` were the prompt of the job that parked it (the rest is its
            reply): a continuation resends all of them.
    """

    lane: int
    tokens: np.ndarray
    last_used: int
    prompt_len: int


@dataclass(frozen=True)
class LaneChoice:
    """The lane a sequence takes and the KV tokens it keeps there (0 unless HIT)."""

    lane: int
    source: LaneSource
    keep: int = 0


@dataclass(frozen=True)
class _Hit:
    """A parked lane sharing at least `min_tokens` with the sequence: the tokens it would keep, and
    whether the sequence continues it (rule 1)."""

    view: ParkedView
    keep: int
    continues: bool


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the longest common prefix of two int arrays (vectorised)."""
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else n


def choose_lane(
    tokens: np.ndarray | None,
    parked: Sequence[ParkedView],
    free: AbstractSet[int],
    min_tokens: int,
    max_keep: int | None = None,
    *,
    lowest_slot: bool = False,
) -> LaneChoice | None:
    """The lane a new sequence takes (see the module docstring for the order).

    Args:
        tokens: the sequence's prefill tokens (prompt + resumed), or None to take a lane cold
            (prefix reuse off, a warm-up probe, a recovery).
        parked: the parked lanes of the sequence's generation.
        free: the FREE lanes.
        min_tokens: the shortest match worth a parked lane (>= 1).
        max_keep: keep at most this many KV tokens of a matched lane (None: the whole match): the
            load's offset check truncates deeper than a next turn would (`offset_probe.py`).
        lowest_slot: fixed slots: after a continuation, the lowest FREE or PARKED slot.

    Returns:
        The choice, or None when no lane is FREE or PARKED.
    """
    hits: list[_Hit] = []
    if tokens is not None and len(tokens) > 1:
        for p in parked:
            shared = common_prefix(tokens, p.tokens)
            match = min(shared, len(tokens) - 1)
            keep = match if max_keep is None else min(match, max_keep)
            if keep >= max(1, min_tokens):
                lost = len(p.tokens) - match  # the cap does not make a continuation a stranger
                hits.append(_Hit(p, keep, shared >= p.prompt_len and lost < CONTINUATION_LOSS_TOKENS))
    continuations = [h for h in hits if h.continues]
    if continuations:
        best = max(continuations, key=lambda h: (h.keep, -h.view.lane))
        return LaneChoice(best.view.lane, LaneSource.HIT, best.keep)
    if lowest_slot and parked and (not free or min(p.lane for p in parked) < min(free)):
        oldest = min(parked, key=lambda p: p.lane)  # not the oldest: the lowest slot
    elif free:
        return LaneChoice(min(free), LaneSource.FREE)
    elif not parked:
        return None
    else:
        oldest = min(parked, key=lambda p: (p.last_used, p.lane))
    shared = next((h.keep for h in hits if h.view is oldest), 0)
    return LaneChoice(oldest.lane, LaneSource.EVICTED, shared)
