"""A row under a constraint: the logits with every token the grammar forbids set to -inf.

Definition (docs/daemon.md "Constrained decoding"): a constrained row is sampled from the MASKED
logits `x'_i = x_i` for an allowed token, `-inf` otherwise, with the usual steps in the usual order
(`row.py`): penalties on the raw row first, then the mask, then temperature, top-k, top-p, min-p and
the draw, all over `x'`. So top-k keeps the k highest-ranked ALLOWED tokens, top-p's mass and min-p's
maximum are the allowed tokens', and the logprobs are the log-softmax of `x'` (a forbidden token has
none). This is vLLM's order: the grammar's bitmask is applied to the logits before the sampling
transforms.

`MaskedRow` is a `RowSource` over any other source (FP32, BF16 in place, top-k) that answers for `x'`
without writing `x'` out unless the whole row is asked for, so a top-k package still decides from its
top K when it can: `upper_set`/`at_least` filter the inner source's candidates by the mask, and a
forbidden token's bound is -inf. A top-k inner source raises `NeedFullRow` exactly where it would for
the unmasked row, plus when too few allowed tokens clear its tail.

`draw_masked_row` is the draw without truncation (the unmasked one is `rejection.py`'s), with a head
that does not depend on the mask's size: H = the allowed tokens among the HEAD_RANK highest-ranked
tokens of the UNMASKED row (ties to the lower id), every other allowed token bounded by
`min(t, m')` (t: the least value of those HEAD_RANK, m': the masked maximum). The envelope dominates
the masked distribution, so accepted tokens follow it exactly; the token is a pure function of
(row, mask, seed, step), whatever the source. A top-k source needs the full row only when no allowed
token is among its top K (the masked maximum) or when a tail proposal cannot be rejected by the tail
maximum's bound.
"""

from __future__ import annotations

import numpy as np

from calculet.daemon.sampling.draw import draw_candidates
from calculet.daemon.sampling.rejection import HEAD_RANK, MAX_TRIALS, first_above, tail_token
from calculet.daemon.sampling.rng import uniform_at
from calculet.daemon.sampling.rowmath import RowMath
from calculet.daemon.sampling.source import RowSource

NEG_INF = np.float32(-np.inf)
SMALL_ALLOWED = 512  # up to this many allowed tokens, an upper set gathers them all at once
GROWTH = 8


class MaskedRow(RowSource):
    """The masked view `x'` of an inner source (module docstring). Reloaded per row; keeps no
    reference to the inner source or the mask after the next load.

    Args:
        size: the row length (vocabulary size).
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self.inner: RowSource | None = None
        self.allowed = np.zeros(size, dtype=bool)
        self.n_allowed = 0
        self._ids: np.ndarray | None = None
        self._dense = np.empty(size, dtype=np.float32)
        self._dense_ready = False
        self._all = np.arange(size)

    def load(self, inner: RowSource, allowed: np.ndarray) -> MaskedRow:
        """Serve `inner` masked by `allowed` (bool [size], at least one True; read only until the next load)."""
        self.inner = inner
        self.allowed = allowed
        self.n_allowed = int(np.count_nonzero(allowed))
        self._ids = None
        self._dense_ready = False
        return self

    @property
    def allowed_ids(self) -> np.ndarray:
        """The allowed ids, ascending (found on first use: most rows never need them)."""
        if self._ids is None:
            self._ids = np.flatnonzero(self.allowed)
        return self._ids

    def _src(self) -> RowSource:
        assert self.inner is not None, "MaskedRow used before load"
        return self.inner

    @property
    def unmasked(self) -> RowSource:
        """The row without the mask (the source this view was loaded with)."""
        return self._src()

    def argmax(self) -> int:
        """The first maximum of `x'` (the highest-ranked allowed token)."""
        ids, _ = self.top_k(1)
        return int(ids[0])

    def value(self, i: int) -> np.float32:
        return self._src().value(i) if self.allowed[i] else NEG_INF

    def value_bound(self, i: int) -> np.float32:
        return self._src().value_bound(i) if self.allowed[i] else NEG_INF

    def dense(self) -> np.ndarray:
        if not self._dense_ready:
            self._dense.fill(NEG_INF)
            np.copyto(self._dense, self._src().dense(), where=self.allowed)
            self._dense_ready = True
        return self._dense

    def upper_set(self, rank: int) -> tuple[np.ndarray, np.ndarray]:
        n_allowed = self.n_allowed
        if rank > n_allowed:  # an upper set reaching a -inf token holds every -inf token: the whole row
            return self._all, self.dense()
        src = self._src()
        want = rank
        while True:
            ids, vals = src.upper_set(want)
            keep = self.allowed[ids]
            if int(np.count_nonzero(keep)) >= rank or ids.shape[0] >= self.size:
                return ids[keep], vals[keep]
            if n_allowed <= SMALL_ALLOWED:
                # Every allowed token is an upper set of x' (each forbidden one is -inf below them).
                return self.allowed_ids, src.values(self.allowed_ids)
            want = max(want * GROWTH, ids.shape[0] + 1)

    def at_least(self, threshold: np.float32) -> tuple[np.ndarray, np.ndarray]:
        """Every allowed token `>= threshold` (a finite threshold: min-p's floor; a forbidden token never is)."""
        ids, vals = self._src().at_least(threshold)
        keep = self.allowed[ids]
        return ids[keep], vals[keep]


def draw_masked_row(rm: RowMath, src: MaskedRow, seed: int, step: int) -> int:
    """A token of the masked row's whole distribution for the uniforms of `(seed, step)` (module docstring).

    Args:
        rm: the row's math over `src` (its maximum is the masked maximum).
        src: the masked row.
        seed / step: the row's RNG key; the draw uses `uniform_at(seed, step, k)` for k = 0, 1, ...
    """
    inner = src.unmasked
    top_ids, top_vals = inner.top_k(HEAD_RANK)  # of the unmasked row: the head does not depend on the mask
    keep = src.allowed[top_ids]
    head_ids, head_vals = top_ids[keep], top_vals[keep]
    n_tail = src.n_allowed - head_ids.shape[0]
    if n_tail <= 0:
        return draw_candidates(head_ids, rm.probs(head_vals), uniform_at(seed, step, 0))
    # Every allowed token outside the head is <= the head's least value and <= the masked maximum.
    bound = min(np.float32(top_vals.min()), rm.m)
    p_t = float(rm.probs(np.asarray([bound], dtype=np.float32))[0])
    head_cum = np.cumsum(rm.probs(head_vals), dtype=np.float64)
    head_mass = float(head_cum[-1]) if head_cum.shape[0] else 0.0
    total = head_mass + n_tail * p_t
    below: np.ndarray | None = None
    for k in range(MAX_TRIALS):
        point = uniform_at(seed, step, 2 * k) * total
        if point < head_mass:
            return int(head_ids[first_above(head_cum, point)])
        if p_t <= 0.0:
            continue
        allowed_ids = src.allowed_ids
        if below is None:  # allowed tail tokens below each head id (head ids are allowed ids)
            below = np.searchsorted(allowed_ids, head_ids) - np.arange(head_ids.shape[0])
        j = min(int((point - head_mass) / p_t), n_tail - 1)
        token = int(allowed_ids[tail_token(below, j)])
        bar = uniform_at(seed, step, 2 * k + 1) * p_t
        # As in `rejection.py`: rejected by a bound when it can be, so a top-k source reads its full
        # row only for a proposal its tail maximum cannot reject.
        if not bar < float(rm.probs(np.asarray([src.value_bound(token)], dtype=np.float32))[0]):
            continue
        if bar < float(rm.probs(np.asarray([src.value(token)], dtype=np.float32))[0]):
            return token
    return rm.draw_full(uniform_at(seed, step, 2 * MAX_TRIALS))
