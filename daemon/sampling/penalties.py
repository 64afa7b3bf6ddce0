"""Repetition, presence and frequency penalties applied in place to one row of logits.

Data flow: the sampler hands the float32 row (its own workspace row, or the serial path's fresh
copy) and the generation's `TokenHistory`; this module gathers the affected logits, computes the
penalised values in float64 and scatters them back, clipped to the finite float32 range so a tiny
repetition penalty can never turn a logit into inf. Cost: O(distinct tokens seen), no Python loop.

Order (vLLM): repetition penalty first (prompt + output, divide positives / multiply negatives),
then frequency and presence (output only, OpenAI: `logit - frequency * count - presence`).
"""

from __future__ import annotations

import numpy as np

from calculet.daemon.sampling.history import TokenHistory
from calculet.daemon.sampling.params import SamplingParams

_F32_MAX = float(np.finfo(np.float32).max)


def apply_penalties(row: np.ndarray, params: SamplingParams, history: TokenHistory) -> None:
    """Penalise `row` (float32 [vocab], finite) in place for the tokens in `history`.

    Args:
        row: the logits of one row; the caller owns it and gives it up for the call.
        params: the row's sampling parameters.
        history: the generation's token history (read only).
    """
    rp = params.repetition_penalty
    if rp != 1.0:
        ids = history.seen_ids
        if ids.size:
            v = row[ids].astype(np.float64)
            v = np.where(v > 0.0, v / rp, v * rp)
            row[ids] = np.clip(v, -_F32_MAX, _F32_MAX)
    freq, pres = params.frequency_penalty, params.presence_penalty
    if freq != 0.0 or pres != 0.0:
        ids = history.generated_ids
        if ids.size:
            # generated_ids holds only tokens generated at least once, so presence applies to each.
            v = row[ids].astype(np.float64) - freq * history.generated_counts - pres
            row[ids] = np.clip(v, -_F32_MAX, _F32_MAX)
