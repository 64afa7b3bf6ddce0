"""Fixed slots: when to move sequences from high slots into free low ones, and the slot figures.

On a device without lane selection (`device/slots.py`) row i of a decode job is KV slot i, so a
decode step pays for the smallest compiled batch that covers the *highest* occupied slot, however
few rows are active: two sequences in slots 0 and 12 cost a batch-16 step. Compaction moves the
sequences in the highest slots into the lowest free (FREE or PARKED) ones so later steps run on a
smaller batch. KV is never copied between lanes (docs/sources.md 000 §7): a move is a re-prefill of
the sequence's prompt and generated tokens into the new slot, after which its old slot is freed.

`compaction_plan` is the decision, a pure function of the package's declared timing (the figures
calsim models the device with, `calsim/timing.py`, read here as the planner reads them in
`chunking.py` and `jump.py`): every sequence above the smallest batch that holds them all moves
below it, when the decode time that batch saves over the steps they may still run exceeds their
re-prefills. One move alone rarely shrinks the batch (the next-highest slot still needs it), so the
decision is over the whole set. The engine asks it between jobs and moves only when every mover is
decode-ready (none in a job or prefilling), one re-prefill each.

`SlotStats` counts, per generation, what the bench reports: the decode batch fill (active rows over
compiled rows of every decode job) and the compactions.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass

from calculet.daemon.package.manifest import TimingDecl


@dataclass
class SlotStats:
    """Decode rows and compactions of one generation (mutated under the engine lock).

    Attributes:
        active_rows / compiled_rows: active rows and compiled batch rows of every decode job.
        compactions: sequences moved to a lower slot by re-prefill.
        compacted_tokens: tokens those re-prefills fed.
    """

    active_rows: int = 0
    compiled_rows: int = 0
    compactions: int = 0
    compacted_tokens: int = 0

    @property
    def fill(self) -> float:
        """Active rows per compiled row of the decode jobs so far (1.0 before any)."""
        return self.active_rows / self.compiled_rows if self.compiled_rows else 1.0


@dataclass(frozen=True)
class SlotMove:
    """One compaction: the sequence in `from_slot` re-prefills `tokens` tokens into `to_slot`."""

    from_slot: int
    to_slot: int
    tokens: int


def batch_for(batches: Sequence[int], slots: int) -> int:
    """The smallest compiled batch holding slots 0..slots-1 (the largest if none does)."""
    return next((b for b in sorted(batches) if b >= slots), max(batches))


def step_ms(timing: TimingDecl, batch: int, kv_len: int) -> float:
    """A decode step of compiled batch `batch` at KV length `kv_len`: the declared curve,
    piecewise-linear and flat outside its points, times `1 + batch_alpha * (batch - 1)`."""
    curve = timing.decode_curve
    j = bisect_right(curve, kv_len, key=lambda p: p.context)
    if j == 0:
        t1 = curve[0].ms_per_token
    elif j == len(curve):
        t1 = curve[-1].ms_per_token
    else:
        a, b = curve[j - 1], curve[j]
        t1 = a.ms_per_token + (b.ms_per_token - a.ms_per_token) * (kv_len - a.context) / (b.context - a.context)
    return t1 * (1.0 + timing.batch_alpha * (batch - 1))


def reprefill_ms(timing: TimingDecl, tokens: int) -> float:
    """A prefill of `tokens` from an empty lane: fixed, per token, and the attention reads (the
    curve's growth, taken as linear over the prompt: each token reads half the final growth)."""
    growth = step_ms(timing, 1, tokens) - step_ms(timing, 1, 0)
    return timing.prefill_fixed_ms + tokens * (timing.prefill_ms_per_token + growth / 2)


@dataclass(frozen=True)
class Occupant:
    """A sequence holding a slot, as the decision sees it: its KV tokens (what a move re-prefills:
    its prompt and generated tokens) and the decode steps it may still run (its `max_tokens` left,
    an upper bound)."""

    slot: int
    kv_len: int
    steps_left: int


def compaction_plan(
    timing: TimingDecl, batches: Sequence[int], occupants: Sequence[Occupant], free: Sequence[int]
) -> list[SlotMove]:
    """The moves that bring every occupant below the smallest batch that holds them all, when they pay.

    Args:
        timing: the package's timing declaration.
        batches: the compiled decode batches.
        occupants: the sequences holding slots.
        free: FREE and PARKED slots (a parked one is evicted by the move, as by a new request).

    Returns:
        The moves, highest slot first, each into the lowest free slot left; empty when the batch
        cannot shrink or the moves do not pay. They pay when the decode time the smaller batch
        saves, `steps * (step(B_now) - step(B_after))` at the longest KV length, over the steps the
        movers may still run (the big batch lasts until the last of them ends), exceeds their
        re-prefills, `sum(reprefill(kv_len))`.
    """
    if not occupants:
        return []
    target = batch_for(batches, len(occupants))
    now = batch_for(batches, max(o.slot for o in occupants) + 1)
    if target >= now:
        return []
    movers = sorted((o for o in occupants if o.slot >= target), key=lambda o: -o.slot)
    spots = sorted(f for f in free if f < target)[: len(movers)]
    if len(spots) < len(movers):  # cannot happen with `target` slots for as many occupants; kept safe
        return []
    kv = max(o.kv_len for o in occupants)
    saved = max(o.steps_left for o in movers) * (step_ms(timing, now, kv) - step_ms(timing, target, kv))
    cost = sum(reprefill_ms(timing, o.kv_len) for o in movers)
    if saved <= cost:
        return []
    return [SlotMove(o.slot, spot, o.kv_len) for o, spot in zip(movers, spots, strict=True)]


__all__ = ["Occupant", "SlotMove", "SlotStats", "batch_for", "compaction_plan", "reprefill_ms", "step_ms"]
