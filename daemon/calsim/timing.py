"""calsim timing model: pure functions from a package's `TimingDecl` to modelled durations.

Data flow: the engine calls `job_durations` once per accepted job (at submit time) and places
the three phases (H2D, compute, D2H) on the modelled device timeline (`clock.py`). Nothing here
reads a clock or sleeps, so the same job always gets the same durations.

Formulas (milliseconds; `t` is the manifest's `TimingDecl`; "KV length" of a row is
`past_kv_len + cur_seq_len`, the positions its last token attends over):

- decode, batch 1, KV length L:    `t1(L) = short + (long - short) * L / long_context`
- decode, compiled batch B:        `t1(L_max) * (1 + alpha * (B - 1))`
  Assumptions: B is the submodel's compiled batch, not the number of active rows (a calbin is
  a static graph: masked rows are computed too, which is why packages ship several batch
  variants); L_max is the longest active row's KV length (attention over the batch is padded
  to its longest row; the MoE weight reads, which dominate, are shared by all rows).
- prefill of n tokens after p:     `fixed + per_token * n + slope * (n * p + n * (n + 1) / 2)`
  with `slope = (long - short) / long_context` ms per KV token read. Attention-read growth
  term (our choice, as the `TimingDecl` docstring asks): the i-th new token (1-based) reads the
  p + i KV entries it attends over at the same per-entry cost the decode line implies. A
  multi-row prefill pays `fixed` once plus the per-row terms of each active row.
- copies:                          `bytes / (gbps * 1e9)` seconds, for the active rows' bytes of
  every input (H2D) and every output (D2H).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from calculet.daemon.device.types import RowSpec, TaskType
from calculet.daemon.package.manifest import TimingDecl


@dataclass(frozen=True)
class JobDurations:
    """Modelled seconds of one job's three phases. `compute` is finite; a hang is a fault, not a
    duration."""

    h2d: float
    compute: float
    d2h: float


def kv_slope_ms(t: TimingDecl) -> float:
    """Milliseconds per KV entry read by one token (the slope of the decode line)."""
    return (t.decode_ms_long - t.decode_ms_short) / t.long_context


def decode_batch1_ms(t: TimingDecl, kv_len: int) -> float:
    """One decode token, batch 1, attending over `kv_len` KV entries."""
    return t.decode_ms_short + kv_slope_ms(t) * kv_len


def decode_ms(t: TimingDecl, batch: int, max_kv_len: int) -> float:
    """One decode step of a compiled batch `batch` whose longest active row has `max_kv_len`."""
    return decode_batch1_ms(t, max_kv_len) * (1.0 + t.batch_alpha * (batch - 1))


def prefill_row_ms(t: TimingDecl, n: int, past: int) -> float:
    """Per-row part of a prefill: `n` new tokens after `past` KV entries (without `fixed`)."""
    reads = n * past + n * (n + 1) / 2
    return t.prefill_ms_per_token * n + kv_slope_ms(t) * reads


def prefill_ms(t: TimingDecl, n: int, past: int) -> float:
    """A one-row prefill of `n` tokens after `past` KV entries."""
    return t.prefill_fixed_ms + prefill_row_ms(t, n, past)


def copy_s(nbytes: int, gbps: float) -> float:
    """Seconds to move `nbytes` at `gbps` gigabytes (1e9 bytes) per second."""
    return nbytes / (gbps * 1e9)


def compute_ms(t: TimingDecl, task: TaskType, batch: int, rows: Sequence[RowSpec]) -> float:
    """Compute time of one job of `task` on a submodel of compiled batch `batch`."""
    if task is TaskType.DECODE:
        return decode_ms(t, batch, max(r.past_kv_len + r.cur_seq_len for r in rows))
    return t.prefill_fixed_ms + sum(prefill_row_ms(t, r.cur_seq_len, r.past_kv_len) for r in rows)


def job_durations(
    t: TimingDecl,
    task: TaskType,
    batch: int,
    rows: Sequence[RowSpec],
    input_bytes: int,
    output_bytes: int,
) -> JobDurations:
    """Durations of one job's phases, in seconds.

    Args:
        t: the package's timing declaration.
        task: prefill or decode.
        batch: the submodel's compiled batch.
        rows: the job's active rows (at least one).
        input_bytes / output_bytes: bytes of the active rows of all inputs / outputs.
    """
    return JobDurations(
        h2d=copy_s(input_bytes, t.h2d_gbps),
        compute=compute_ms(t, task, batch, rows) / 1000.0,
        d2h=copy_s(output_bytes, t.d2h_gbps),
    )
