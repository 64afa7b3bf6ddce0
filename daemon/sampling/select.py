"""Exact candidate selection without sorting the vocabulary: top-k, top-p nucleus, thresholds.

Data flow: each function reads one float32 row `x` (penalised logits, finite) and returns the
selected `(ids, values)` as small fresh arrays; the only full-vocabulary writes go to the caller's
preallocated boolean `mask`.

The prefilter (DESIGN.md section 9): the k-th largest value of any subset of the row is a lower
bound of the row's true k-th largest, because at least k elements (those k in the subset) are >= it.
So every element of the true top k passes `x >= bound`, and only those few are partitioned. The
subset is a strided view (`x[::stride]`); a bad order in the row only makes the candidate set
larger, never wrong. When the subset has fewer than k elements there is no bound and every
element is a candidate (the exact fallback, which allocates O(vocab) index arrays).

Ranking everywhere is (value descending, token id ascending), so ties are broken by lower id and
results do not depend on sort stability or on which rows share the batch.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

# The top-p search widens its candidate set by this factor each round (8 subsample ranks, 64, 512...).
_NUCLEUS_START = 8
_NUCLEUS_GROWTH = 8


def threshold_candidates(x: np.ndarray, threshold: float, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Ids (ascending) and values of the elements with `x >= threshold`.

    Args:
        x: float32 [vocab] row.
        threshold: inclusive lower bound (compared in float32).
        mask: preallocated bool [vocab] scratch, overwritten.
    """
    np.greater_equal(x, np.float32(threshold), out=mask)
    ids = np.flatnonzero(mask)
    return ids, x[ids]


def subsample_kth_bound(x: np.ndarray, k: int, stride: int) -> float | None:
    """A lower bound of the k-th largest element of `x`, or None when the subsample is too small."""
    sub = x[::stride]
    if k > sub.shape[0]:
        return None
    pos = sub.shape[0] - k
    return float(np.partition(sub, pos)[pos])


def top_k(x: np.ndarray, k: int, stride: int, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Exactly the k highest-ranked elements of `x` (ties: lower ids first); ids ascending.

    Args:
        x: float32 [vocab] row.
        k: how many to keep (>= 1); k >= vocab keeps all.
        stride: prefilter subsample stride.
        mask: preallocated bool [vocab] scratch.
    """
    n = x.shape[0]
    if k >= n:
        ids = np.arange(n)
        return ids, x[ids]
    bound = subsample_kth_bound(x, k, stride)
    if bound is None:
        ids = np.arange(n)
        vals = x[ids]
    else:
        ids, vals = threshold_candidates(x, bound, mask)
    return _exactly_k(ids, vals, k)


def _exactly_k(ids: np.ndarray, vals: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Keep the k highest-ranked of a candidate set that contains them (ids ascending in and out)."""
    if vals.shape[0] == k:
        return ids, vals
    pos = vals.shape[0] - k
    kth = vals.dtype.type(np.partition(vals, pos)[pos])
    keep = vals > kth
    missing = k - int(np.count_nonzero(keep))
    # Ids ascend, so the first `missing` elements equal to the k-th value are the lowest ids.
    keep[np.flatnonzero(vals == kth)[:missing]] = True
    return ids[keep], vals[keep]


def rank_order(ids: np.ndarray, vals: np.ndarray) -> np.ndarray:
    """Permutation sorting candidates by (value descending, id ascending)."""
    return np.lexsort((ids, -vals))


def nucleus_of(
    ids: np.ndarray, vals: np.ndarray, top_p: float, probs: Callable[[np.ndarray], np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    """The top-p prefix (in rank order) of an explicit candidate pool, renormalised over the pool.

    Args:
        ids / vals: the pool (e.g. the top-k set).
        top_p: in (0, 1).
        probs: maps values to unnormalised float32 probabilities (exp of the scaled logits).

    Returns:
        ids and values of the kept prefix, in rank order.
    """
    order = rank_order(ids, vals)
    ids, vals = ids[order], vals[order]
    cum = np.cumsum(probs(vals), dtype=np.float64)
    cut = _prefix_len(cum, top_p * float(cum[-1]))
    return ids[:cut], vals[:cut]


def nucleus_full(
    x: np.ndarray,
    top_p: float,
    total_mass: float,
    probs: Callable[[np.ndarray], np.ndarray],
    stride: int,
    mask: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """The top-p prefix (in rank order) over the whole row, without sorting the whole row.

    Candidate sets `x >= bound_j` for widening subsample ranks j are upper sets of the ranking, so
    each one's sorted order is a prefix of the full sorted order and its cumulative sums are the
    full ones. The first set whose mass reaches `top_p * total_mass` therefore holds exactly the
    nucleus the full sort would give; the last round takes the whole row.

    Args:
        x: float32 [vocab] row.
        top_p: in (0, 1).
        total_mass: sum over the row of `probs(x)` (the normaliser).
        probs: maps values to unnormalised float32 probabilities.
        stride: prefilter subsample stride.
        mask: preallocated bool [vocab] scratch.
    """
    target = top_p * total_mass
    rank = _NUCLEUS_START
    while True:
        bound = subsample_kth_bound(x, rank, stride)
        last = bound is None
        if bound is None:
            ids = np.arange(x.shape[0])
            vals = x[ids]
        else:
            ids, vals = threshold_candidates(x, bound, mask)
        order = rank_order(ids, vals)
        vals = vals[order]
        cum = np.cumsum(probs(vals), dtype=np.float64)
        if last or cum[-1] >= target:
            cut = _prefix_len(cum, target)
            return ids[order[:cut]], vals[:cut]
        rank *= _NUCLEUS_GROWTH


def _prefix_len(cum: np.ndarray, target: float) -> int:
    """Length of the shortest prefix whose cumulative mass reaches `target` (all if none does)."""
    return min(int(np.searchsorted(cum, target, side="left")) + 1, cum.shape[0])
