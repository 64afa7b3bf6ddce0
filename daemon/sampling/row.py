"""One row's sampling after its logits are FP32 and finite: the order of operations lives here.

Both `Sampler` policies call `RowFinisher.finish` with the same float32 values, so they draw
the same tokens. Order, for a row with penalised logits `x` (the
caller has applied penalties) and row maximum `m` at index `argmax`:

1. penalties (caller, `penalties.apply_penalties`), then the argmax of the penalised row;
2. temperature: `z = (x - m) * float32(1/T)`; rows with T < GREEDY_TEMPERATURE return `argmax`
   (lowest id among equal maxima) and draw nothing;
3. top-k: exactly the k highest-ranked tokens (rank = logit desc, id asc);
4. top-p: the shortest rank-order prefix of what is left whose renormalised mass reaches top_p;
5. min-p: keep `x >= m + T * ln(min_p)` (i.e. p >= min_p * p_max), threshold rounded to float32;
6. draw: `u = rng.uniform(seed, step)`, inverse CDF over the survivors in ascending token id,
   probabilities `exp(z)` in float32 accumulated in float64.

Steps 3-5 each keep the argmax, so the candidate set is never empty. Logprobs: see `logprobs.py`.
Ownership: `RowScratch` belongs to one caller and serves one row at a time; `finish` reads `x`
and writes only the scratch.
"""

from __future__ import annotations

import math

import numpy as np

from calculet.daemon.sampling.draw import FullMass, draw_candidates, draw_full
from calculet.daemon.sampling.logprobs import scaled, token_logprob, top_logprobs
from calculet.daemon.sampling.params import SamplingParams
from calculet.daemon.sampling.rng import uniform
from calculet.daemon.sampling.select import nucleus_full, nucleus_of, threshold_candidates, top_k
from calculet.daemon.sampling.types import RowResult, RowSampling

DEFAULT_BLOCK = 1024  # measured: fewer, longer block sums are cheaper; the draw scans one block
DEFAULT_STRIDE = 16


class RowScratch:
    """Full-vocabulary scratch for one row: float32 probabilities (zero-padded to whole blocks)
    and a bool mask. Allocated once; `finish` overwrites it for every row."""

    def __init__(self, vocab_size: int, block: int = DEFAULT_BLOCK) -> None:
        padded = -(-vocab_size // block) * block
        self.probs = np.zeros(padded, dtype=np.float32)  # [vocab:] stays 0 forever
        self.mask = np.empty(vocab_size, dtype=bool)


class _RowMath:
    """The row's scalars and its full-vocabulary mass, computed at most once per row."""

    def __init__(self, x: np.ndarray, argmax: int, temperature: float, scratch: RowScratch, block: int) -> None:
        self.x = x
        self.m = x[argmax]
        self.temperature = temperature
        self.inv_t = np.float32(1.0 / temperature)
        self._scratch = scratch
        self._block = block
        self._mass: FullMass | None = None

    def probs(self, vals: np.ndarray) -> np.ndarray:
        return np.exp(scaled(vals, self.m, self.inv_t))

    def mass(self) -> FullMass:
        if self._mass is None:
            out = self._scratch.probs[: self.x.shape[0]]
            np.exp(scaled(self.x, self.m, self.inv_t, out=out), out=out)
            self._mass = FullMass.of(self._scratch.probs, self._block)
        return self._mass


class RowFinisher:
    """Turns one row's penalised FP32 logits into a `RowResult` (stateless between rows).

    Args:
        vocab_size: row width.
        stride: prefilter subsample stride (speed only; results do not depend on it).
        block: mass block size (the scratch must be built with the same block).
    """

    def __init__(self, vocab_size: int, stride: int = DEFAULT_STRIDE, block: int = DEFAULT_BLOCK) -> None:
        self.vocab_size = vocab_size
        self.stride = stride
        self.block = block

    def finish(self, x: np.ndarray, argmax: int, row: RowSampling, scratch: RowScratch) -> RowResult:
        """Sample one row.

        Args:
            x: float32 [vocab], penalised, finite; read only.
            argmax: index of the first maximum of `x`.
            row: the row's parameters, step and history.
            scratch: this caller's scratch (overwritten).
        """
        p = row.params
        rm = _RowMath(x, argmax, 1.0 if p.greedy else p.temperature, scratch, self.block)
        token = argmax if p.greedy else self._draw(rm, p, uniform(p.seed, row.step), scratch)
        if p.logprobs is None:
            return RowResult(token)
        log_total = math.log(rm.mass().total)
        logprob = token_logprob(x[token], rm.m, rm.inv_t, log_total)
        top: tuple[tuple[int, float], ...] = ()
        if p.logprobs > 0:
            top = top_logprobs(x, p.logprobs, rm.m, rm.inv_t, log_total, self.stride, scratch.mask)
        return RowResult(token, logprob, top)

    def _draw(self, rm: _RowMath, p: SamplingParams, u: float, scratch: RowScratch) -> int:
        x = rm.x
        k = p.top_k if 0 < p.top_k < self.vocab_size else 0
        min_p_floor = float(rm.m) + rm.temperature * math.log(p.min_p) if p.min_p > 0.0 else None
        if k:
            ids, vals = top_k(x, k, self.stride, scratch.mask)
            if p.top_p < 1.0:
                ids, vals = nucleus_of(ids, vals, p.top_p, rm.probs)
        elif p.top_p < 1.0:
            ids, vals = nucleus_full(x, p.top_p, rm.mass().total, rm.probs, self.stride, scratch.mask)
        elif min_p_floor is not None:
            ids, vals = threshold_candidates(x, min_p_floor, scratch.mask)
        else:
            return draw_full(scratch.probs, rm.mass(), self.block, u)
        if min_p_floor is not None:
            keep = vals >= np.float32(min_p_floor)
            ids, vals = ids[keep], vals[keep]
        by_id = np.argsort(ids)
        ids, vals = ids[by_id], vals[by_id]
        return draw_candidates(ids, rm.probs(vals), u)
