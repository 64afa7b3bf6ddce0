"""Fixed slots: when to move a sequence from a high slot into a free low one, and the slot figures.

On a device without lane selection (`device/slots.py`) row i of a decode job is KV slot i, so a
decode step pays for the smallest compiled batch that covers the *highest* occupied slot, however
few rows are active: two sequences in slots 0 and 12 cost a batch-16 step. Compaction moves the
sequence in the highest slot into the lowest free (FREE or PARKED) one so later steps run on a smaller batch. KV is
never copied between lanes (docs/sources.md 000 §7): the move is a re-prefill of the sequence's
prompt and generated tokens into the new slot, after which its old slot is freed.

`compaction_pays` is the decision, a pure function of the package's declared timing (the figures
calsim models the device with, `calsim/timing.py`, read here as the planner reads them in
`chunking.py` and `jump.py`): the decode time the smaller batch saves over the steps
the running sequences still have at most, against the re-prefill of the moved sequence. The engine
asks it only between jobs of the model, with the moved sequence decode-ready.

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


def compaction_pays(
    timing: TimingDecl,
    batches: Sequence[int],
    occupied: Sequence[int],
    free: Sequence[int],
    kv_len: int,
    steps_left: int,
) -> SlotMove | None:
    """Whether to move the sequence in the highest occupied slot into the lowest free slot below it.

    Args:
        timing: the package's timing declaration.
        batches: the compiled decode batches.
        occupied: slots held by running sequences (the highest one is the candidate).
        free: FREE and PARKED slots (a parked one is evicted by the move, as by a new request).
        kv_len: KV tokens of the candidate (what it re-prefills: its prompt and generated tokens).
        steps_left: decode steps the others still run at most (their remaining `max_tokens`), the
            steps the smaller batch can save.

    Returns:
        The move, or None when there is none or it does not pay: the saved decode time
        `steps_left * (decode(B_now) - decode(B_after))`, at the candidate's KV length, must exceed
        the re-prefill `prefill(kv_len)`.
    """
    if not occupied or not free or kv_len < 1 or steps_left < 1:
        return None
    top = max(occupied)
    low = min(free)
    if low >= top:
        return None
    after = sorted([s for s in occupied if s != top] + [low])
    now_batch, after_batch = batch_for(batches, top + 1), batch_for(batches, after[-1] + 1)
    if after_batch >= now_batch:
        return None
    saved = steps_left * (step_ms(timing, now_batch, kv_len) - step_ms(timing, after_batch, kv_len))
    cost = reprefill_ms(timing, kv_len)
    return SlotMove(top, low, kv_len) if saved > cost else None


__all__ = ["SlotMove", "SlotStats", "batch_for", "compaction_pays", "reprefill_ms", "step_ms"]
