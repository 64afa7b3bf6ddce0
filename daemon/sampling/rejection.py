"""A draw from the whole row (temperature sampling, no truncation) without the whole row's `exp`.

The distribution is the row's float32 probabilities `p_i = exp((x_i - m) / T)`, as everywhere; only
the way a token is picked from it differs from an inverse CDF over the vocabulary, which needs every
`p_i` (an `exp` of 151,936 logits: about 0.4-0.7 ms a row on our machines, the largest host cost of a
decode step at OpenAI's default temperature 1). Rejection sampling from an envelope instead:

- head H: exactly the HEAD_RANK highest-ranked tokens (`top_k`, ties to the lower id, so the head
  and hence the token do not depend on the prefilter's group size), with their exact probabilities;
  every other token (the tail, n of them) is at most the head's least value t, so `p_i <= p(t)`;
- envelope q: `p_i` on the head, `p(t)` on each tail token. One uniform `a` picks a point of
  `[0, S_H + n p(t))`: inside the head's cumulative mass it is the head token there (inverse CDF in
  id order, as `draw.draw_candidates`); past it, it names tail token number `(a' - S_H) / p(t)`
  (uniform over the tail), accepted when a second uniform `b` has `b p(t) < p_j` (decided from an
  upper bound of `x_j` first when the row's source has one: `RowSource.value_bound`);
- a rejected proposal draws the next pair (`rng.uniform_at`), up to MAX_TRIALS, then the full inverse
  CDF (`RowMath.draw_full`) decides.

Accepted tokens follow p exactly (the envelope dominates p; `p(t)` is computed with the same float32
operations as each `p_j`, and rounding is monotone). The expected number of proposals is
`(S_H + n p(t)) / S`: about 1.1-1.5 for a language model's row with a few % of its mass in the tail,
about 10 when a heavy N(0, 2) bulk holds 7 %. The token is a pure function of (row, seed, step), so
batch and policy invariance hold; it is not the token an inverse CDF over the same u would give.
"""

from __future__ import annotations

import numpy as np

from calculet.daemon.sampling.rng import uniform_at
from calculet.daemon.sampling.rowmath import RowMath

HEAD_RANK = 128  # a larger head tightens the tail bound (fewer proposals) but costs more to find
MAX_TRIALS = 64


def draw_whole_row(rm: RowMath, seed: int, step: int) -> int:
    """A token of the whole row's distribution for the uniforms of `(seed, step)`.

    Args:
        rm: the row's math (its source, maximum and temperature).
        seed / step: the row's RNG key; the draw uses `uniform_at(seed, step, k)` for k = 0, 1, ...
    """
    src = rm.src
    ids, vals = src.top_k(HEAD_RANK)
    n_tail = src.size - ids.shape[0]
    if n_tail <= 0:
        return rm.draw_full(uniform_at(seed, step, 0))
    head_cum = np.cumsum(rm.probs(vals), dtype=np.float64)  # ids ascend: cumulative mass in id order
    head_mass = float(head_cum[-1])
    p_t = float(rm.probs(np.asarray([vals.min()], dtype=np.float32))[0])
    total = head_mass + n_tail * p_t
    below = ids - np.arange(ids.shape[0])  # tail tokens below each head id
    for k in range(MAX_TRIALS):
        point = uniform_at(seed, step, 2 * k) * total
        if point < head_mass:
            return int(ids[first_above(head_cum, point)])
        token = tail_token(below, min(int((point - head_mass) / p_t), n_tail - 1))
        bar = uniform_at(seed, step, 2 * k + 1) * p_t
        # Rejected by a bound alone when it can be: p_j <= p(bound) <= bar. Where the source holds
        # the value the bound is the value, so the decision is the same on every source, and a
        # top-k source reads its full row only for a proposal the tail maximum cannot reject.
        if not bar < float(rm.probs(np.asarray([src.value_bound(token)], dtype=np.float32))[0]):
            continue
        p_j = float(rm.probs(np.asarray([src.value(token)], dtype=np.float32))[0])
        if bar < p_j:
            return token
    return rm.draw_full(uniform_at(seed, step, 2 * MAX_TRIALS))


def tail_token(below: np.ndarray, j: int) -> int:
    """The j-th token (0-based, ascending id) that is not in the head, where `below[i]` is the number
    of tail tokens below the i-th head id (`head_ids - arange`, non-decreasing)."""
    return j + int(np.searchsorted(below, j, side="right"))


def first_above(cum: np.ndarray, target: float) -> int:
    """First index whose cumulative mass exceeds `target` (a zero-probability token never wins)."""
    return min(int(np.searchsorted(cum, target, side="right")), cum.shape[0] - 1)
