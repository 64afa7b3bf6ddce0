"""Exact selection on small candidate sets: exactly k of a superset, rank order, the nucleus of a pool.

Data flow: each function reads candidate `(ids, values)` arrays (ids ascending unless said otherwise,
float32 values) that a `RowSource` produced, and returns small fresh arrays. Finding the candidates
without touching every element more than once is the sources' job (`source.py`, `bf16.py`,
`groups.py`); searching the whole row's nucleus is `nucleus.py`'s.

Ranking everywhere is (value descending, token id ascending), so ties are broken by lower id and
results do not depend on sort stability or on which rows share the batch.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def exactly_k(ids: np.ndarray, vals: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Keep the k highest-ranked of a candidate set that contains them (ids ascending in and out).

    Args:
        ids / vals: an upper set of the ranking with at least min(k, row size) elements.
        k: how many to keep (>= 1); a set of k or fewer is returned unchanged.
    """
    if vals.shape[0] <= k:
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


def prefix_len(cum: np.ndarray, target: float) -> int:
    """Length of the shortest prefix whose cumulative mass reaches `target` (all if none does)."""
    return min(int(np.searchsorted(cum, target, side="left")) + 1, cum.shape[0])


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
    cut = prefix_len(cum, top_p * float(cum[-1]))
    return ids[:cut], vals[:cut]
