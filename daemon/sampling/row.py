"""One row's sampling after its logits are known finite: the order of operations lives here.

Every path calls `RowFinisher.finish` with a `RowSource` holding the same float32 values (the BF16 row
read in place, or an FP32 row), so they draw the same tokens. Order, for a row with penalised logits
`x` (the caller has applied penalties) and row maximum `m` at index `argmax`:

1. penalties (caller, `penalties.apply_penalties`), then the argmax of the penalised row;
2. temperature: `z = (x - m) * float32(1/T)`; rows with T < GREEDY_TEMPERATURE return `argmax`
   (lowest id among equal maxima) and draw nothing;
3. top-k: exactly the k highest-ranked tokens (rank = logit desc, id asc);
4. top-p: the shortest rank-order prefix of what is left whose renormalised mass reaches top_p
   (over the whole row: `nucleus.py`, which sorts only upper sets of the ranking);
5. min-p: keep `x >= m + T * ln(min_p)` (i.e. p >= min_p * p_max), threshold rounded to float32;
6. draw: `u = rng.uniform(seed, step)`, inverse CDF over the survivors in ascending token id,
   probabilities `exp(z)` in float32 accumulated in float64; with no truncation at all (steps 3-5
   off), rejection sampling from the exact head of the ranking and a bound on the tail instead
   (`rejection.py`: the same distribution, without an `exp` of the whole row).

A constrained row (`masked.py`) runs the same steps over its masked logits: forbidden tokens are
-inf after step 1, so every later step sees only allowed tokens.

Steps 3-5 each keep the argmax, so the candidate set is never empty. Logprobs: see `logprobs.py`.
The whole row's probabilities are computed only for a top-p without top-k (the normaliser) and
for logprobs.
Ownership: `RowScratch` belongs to one caller and serves one row at a time; `finish` reads the
source and writes only the scratch.
"""

from __future__ import annotations

import math

import numpy as np

from calculet.daemon.sampling.draw import draw_candidates
from calculet.daemon.sampling.logprobs import token_logprob, top_logprobs
from calculet.daemon.sampling.masked import MaskedRow, draw_masked_row
from calculet.daemon.sampling.nucleus import nucleus
from calculet.daemon.sampling.params import SamplingParams
from calculet.daemon.sampling.rejection import draw_whole_row
from calculet.daemon.sampling.rng import uniform
from calculet.daemon.sampling.rowmath import RowMath, RowScratch
from calculet.daemon.sampling.select import nucleus_of
from calculet.daemon.sampling.source import RowSource
from calculet.daemon.sampling.types import RowResult, RowSampling

DEFAULT_GROUP = 64  # prefilter group size (speed only): 32..256 measured within noise at vocab 151,936


class RowFinisher:
    """Turns one row's penalised logits into a `RowResult` (stateless between rows).

    Args:
        vocab_size: row width.
    """

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size

    def finish(self, src: RowSource, argmax: int, row: RowSampling, scratch: RowScratch) -> RowResult:
        """Sample one row.

        Args:
            src: the row's logits (penalised, finite); read only.
            argmax: index of the row's first maximum.
            row: the row's parameters, step and history.
            scratch: this caller's scratch (overwritten).
        """
        p = row.params
        if p.greedy and p.logprobs is None:
            return RowResult(argmax)
        rm = RowMath(src, argmax, 1.0 if p.greedy else p.temperature, scratch)
        token = argmax if p.greedy else self._draw(rm, p, row.step)
        if p.logprobs is None:
            return RowResult(token)
        log_total = math.log(rm.mass().total)
        logprob = token_logprob(src.value(token), rm.m, rm.inv_t, log_total)
        top: tuple[tuple[int, float], ...] = ()
        if p.logprobs > 0:
            top = top_logprobs(src, p.logprobs, rm.m, rm.inv_t, log_total)
        return RowResult(token, logprob, top)

    def _draw(self, rm: RowMath, p: SamplingParams, step: int) -> int:
        src = rm.src
        k = p.top_k if 0 < p.top_k < self.vocab_size else 0
        min_p_floor = float(rm.m) + rm.temperature * math.log(p.min_p) if p.min_p > 0.0 else None
        if k:
            ids, vals = src.top_k(k)
            if p.top_p < 1.0:
                ids, vals = nucleus_of(ids, vals, p.top_p, rm.probs)
        elif p.top_p < 1.0:
            ids, vals = nucleus(src, p.top_p, rm)
        elif min_p_floor is not None:
            ids, vals = src.at_least(np.float32(min_p_floor))
        elif isinstance(src, MaskedRow):
            return draw_masked_row(rm, src, p.seed, step)
        else:
            return draw_whole_row(rm, p.seed, step)
        if min_p_floor is not None:
            keep = vals >= np.float32(min_p_floor)
            ids, vals = ids[keep], vals[keep]
        by_id = np.argsort(ids)
        return draw_candidates(ids[by_id], rm.probs(vals[by_id]), uniform(p.seed, step))
