"""calsim timing model: pure functions from a package's `TimingDecl` to modelled durations.

Data flow: the engine calls `job_durations` once per accepted job (at submit time) and places
the three phases (H2D, compute, D2H) on the modelled device timeline (`clock.py`); the byte
counts it passes come from `h2d_bytes` / `d2h_bytes`. Nothing here reads a clock or sleeps, so
the same job always gets the same durations.

Formulas (milliseconds; `t` is the manifest's `TimingDecl`; "KV length" of a row is
`past_kv_len + cur_seq_len`, the positions its last token attends over):

- decode, batch 1, KV length L:    `t1(L)` = `t.decode_curve` at L: piecewise-linear between
  the points `(context, ms_per_token)`, exact at each point. Outside the points the curve is
  FLAT (our choice): below the first point `t1` is the first point's ms (no measured speed-up
  below it), above the last one the last point's ms. Flat rather than extrapolated because a
  measured table says nothing beyond its ends and a line extended from two noisy points can run
  away. The validator makes the last point reach the package context, so a valid package never
  asks above it (KV length <= context); below a first point > 0 the flat part is real model (the
  calsim packages hold the measured short-context speed up to 512 tokens).
- decode, compiled batch B:        `t1(L_max) * (1 + alpha * (B - 1))`
  Assumptions: B is the submodel's compiled batch, not the number of active rows (a calbin is
  a static graph: masked rows are computed too, which is why packages ship several batch
  variants); L_max is the longest active row's KV length (attention over the batch is padded
  to its longest row; the MoE weight reads, which dominate, are shared by all rows).
- prefill of n tokens after p:     `fixed + per_token * n + sum(t1(p + i) - t1(0), i = 1..n)`
  Attention-read term (our choice, derived from the curve rather than declared separately): the
  i-th new token (1-based) reads the p + i KV entries it attends over, and reading them costs
  what the decode curve says they add to a token over an empty context, `t1(p + i) - t1(0)`,
  i.e. the integral of the curve's LOCAL slope from 0 to p + i. One curve therefore drives both
  phases (no second figure to keep consistent), and for a two-point curve this is exactly the
  former linear model's `slope * (n * p + n * (n + 1) / 2)`. It is computed in closed form per
  curve segment (`_curve_sum`), not token by token. A multi-row prefill pays `fixed` once plus
  the per-row terms of each active row. Effect on the qwen preset (docs/sources.md 001 §10 curve, flat at 58.25
  tok/s up to 512 tokens, vs the former 17.167 -> 80 ms line; fixed 17.167 ms, 4.791 ms/token):
  27 tokens 146.5 ms (was 147.1: now exactly the measured 184.27 tok/s), 256 tokens 1,244 ms
  (was 1,294), 2,048 tokens 14.9 s (was 13.0), 40,960 tokens 1,823 s (was 1,483): the measured
  curve is steeper than the line between 512 and 4K, so long prompts cost more than before.
- copies:                          `bytes / (gbps * 1e9)` seconds. H2D moves, of every input
  `[batch, max_tokens]`, the first `cur_seq_len` tokens of each active row (`h2d_bytes`): the
  host slices tokens/positions to the row's new tokens before the copy (docs/sources.md 001 §4,
  step 8), so a 27-token prefill on a 40,960-token bucket copies 27 tokens, not the bucket.
  D2H moves each active row of every output (`d2h_bytes`; logits are `[batch, vocab]`).
- cross-chip (D2D), only for a package declaring `topology.d2d` (`d`):
                                   `d.syncs_per_job * d.sync_us / 1e6 + bytes / (d.link_gbps * 1e9)`
  seconds, ADDED to the compute phase: the chips wait on the link between layers (every layer
  synchronises, docs/sources.md 000 §11), so the link time is not hidden behind compute. Bytes
  (`d2d_bytes`): `d.bytes_per_token` per compiled row of a decode job (a static graph moves masked
  rows too, as it computes them) and per new token of a prefill job (prefill's D2D is dynamic, cut
  to the sequence: docs/sources.md 003 §11). A package without `d2d` pays nothing here: the
  presets' curves are measured on today's tensor-parallel board and already hold its link time.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import pairwise

from calculet.daemon.device.types import RowSpec, TaskType
from calculet.daemon.package.manifest import D2DDecl, DecodePoint, TimingDecl


@dataclass(frozen=True)
class JobDurations:
    """Modelled seconds of one job's three phases. `compute` is finite; a hang is a fault, not a
    duration."""

    h2d: float
    compute: float  # D2D included
    d2h: float
    d2d: float = 0.0  # the part of `compute` spent on cross-chip traffic
    d2d_bytes: int = 0


def curve_ms(curve: Sequence[DecodePoint], kv_len: float) -> float:
    """The curve at `kv_len`: piecewise-linear between points, flat outside them.

    Args:
        curve: at least one point, contexts strictly increasing (the validator's rules).
        kv_len: KV entries attended over.
    """
    first, last = curve[0], curve[-1]
    if kv_len <= first.context:
        return first.ms_per_token
    if kv_len >= last.context:
        return last.ms_per_token
    j = bisect_right(curve, kv_len, key=lambda p: p.context)  # first point beyond kv_len: 1 <= j < len
    a, b = curve[j - 1], curve[j]
    return a.ms_per_token + (b.ms_per_token - a.ms_per_token) * (kv_len - a.context) / (b.context - a.context)


def _curve_sum(curve: Sequence[DecodePoint], x: int) -> float:
    """`sum(curve_ms(curve, k) for k in 1..x)` in closed form: O(points), not O(x)."""
    total = 0.0
    done = 0  # the integers 1..done are summed
    first = curve[0]
    if first.context > 0:  # flat below the first point
        done = min(x, first.context)
        total += done * first.ms_per_token
    for a, b in pairwise(curve):
        end = min(x, b.context)
        start = max(done, a.context)
        n = end - start
        if n <= 0:
            continue
        slope = (b.ms_per_token - a.ms_per_token) / (b.context - a.context)
        # k = start+1 .. end on the segment a -> b: a.ms + slope * (k - a.context)
        total += n * a.ms_per_token + slope * (n * (start - a.context) + n * (n + 1) / 2)
        done = end
    if x > done:  # flat above the last point
        total += (x - done) * curve[-1].ms_per_token
    return total


def decode_batch1_ms(t: TimingDecl, kv_len: int) -> float:
    """One decode token, batch 1, attending over `kv_len` KV entries."""
    return curve_ms(t.decode_curve, kv_len)


def decode_ms(t: TimingDecl, batch: int, max_kv_len: int) -> float:
    """One decode step of a compiled batch `batch` whose longest active row has `max_kv_len`."""
    return decode_batch1_ms(t, max_kv_len) * (1.0 + t.batch_alpha * (batch - 1))


def attention_ms(t: TimingDecl, n: int, past: int) -> float:
    """KV-read part of prefilling `n` tokens after `past`: `sum(t1(past + i) - t1(0), i = 1..n)`."""
    c = t.decode_curve
    return _curve_sum(c, past + n) - _curve_sum(c, past) - n * curve_ms(c, 0)


def prefill_row_ms(t: TimingDecl, n: int, past: int) -> float:
    """Per-row part of a prefill: `n` new tokens after `past` KV entries (without `fixed`)."""
    return t.prefill_ms_per_token * n + attention_ms(t, n, past)


def prefill_ms(t: TimingDecl, n: int, past: int) -> float:
    """A one-row prefill of `n` tokens after `past` KV entries."""
    return t.prefill_fixed_ms + prefill_row_ms(t, n, past)


def copy_s(nbytes: int, gbps: float) -> float:
    """Seconds to move `nbytes` at `gbps` gigabytes (1e9 bytes) per second."""
    return nbytes / (gbps * 1e9)


def h2d_bytes(input_nbytes: Iterable[int], batch: int, max_tokens: int, rows: Sequence[RowSpec]) -> int:
    """Bytes H2D moves for a job: of each input `[batch, max_tokens]` (whole-buffer sizes in
    `input_nbytes`), `cur_seq_len` tokens of every active row; masked rows and the unused tail
    of each row's token bucket stay on the host."""
    tokens = sum(r.cur_seq_len for r in rows)
    return sum(nbytes // (batch * max_tokens) * tokens for nbytes in input_nbytes)


def d2h_bytes(output_nbytes: Iterable[int], batch: int, rows: Sequence[RowSpec]) -> int:
    """Bytes D2H moves for a job: each active row of every output (`[batch, ...]`)."""
    return sum(nbytes // batch * len(rows) for nbytes in output_nbytes)


def compute_ms(t: TimingDecl, task: TaskType, batch: int, rows: Sequence[RowSpec]) -> float:
    """Compute time of one job of `task` on a submodel of compiled batch `batch`."""
    if task is TaskType.DECODE:
        return decode_ms(t, batch, max(r.past_kv_len + r.cur_seq_len for r in rows))
    return t.prefill_fixed_ms + sum(prefill_row_ms(t, r.cur_seq_len, r.past_kv_len) for r in rows)


def d2d_bytes(d: D2DDecl, task: TaskType, batch: int, rows: Sequence[RowSpec]) -> int:
    """Cross-chip bytes of one job: per compiled row of a decode, per new token of a prefill."""
    tokens = batch if task is TaskType.DECODE else sum(r.cur_seq_len for r in rows)
    return d.bytes_per_token * tokens


def d2d_s(d: D2DDecl, nbytes: int) -> float:
    """Seconds a job waits on the link: its synchronisations plus `nbytes` at the link rate."""
    return d.syncs_per_job * d.sync_us / 1e6 + copy_s(nbytes, d.link_gbps)


def job_durations(
    t: TimingDecl,
    task: TaskType,
    batch: int,
    rows: Sequence[RowSpec],
    input_bytes: int,
    output_bytes: int,
    d2d: D2DDecl | None = None,
) -> JobDurations:
    """Durations of one job's phases, in seconds.

    Args:
        t: the package's timing declaration.
        task: prefill or decode.
        batch: the submodel's compiled batch.
        rows: the job's active rows (at least one).
        input_bytes / output_bytes: what H2D / D2H move (`h2d_bytes` / `d2h_bytes`).
        d2d: the package's cross-chip traffic (`topology.d2d`; None: none modelled).
    """
    moved = d2d_bytes(d2d, task, batch, rows) if d2d is not None else 0
    link = d2d_s(d2d, moved) if d2d is not None else 0.0
    return JobDurations(
        h2d=copy_s(input_bytes, t.h2d_gbps),
        compute=compute_ms(t, task, batch, rows) / 1000.0 + link,
        d2h=copy_s(output_bytes, t.d2h_gbps),
        d2d=link,
        d2d_bytes=moved,
    )
