"""The top-p nucleus of a whole row without sorting the whole row (unless the nucleus is most of it).

The nucleus is the shortest rank-order prefix (value descending, id ascending) whose mass reaches
`top_p * total`, `total` being the row's whole mass (`RowMath.mass().total`: float32 `exp` of every
scaled logit, summed by block). An upper set of the ranking (every element `>=` some value) sorted by
rank is a prefix of the full sort, so its float64 cumulative sums are exactly the first sums of the
full sort's. The first upper set whose mass reaches the target therefore holds exactly the nucleus a
full sort would give, bit for bit. Upper sets come from the source's exact prefilter (`upper_set`):
64 elements first, then 8 times more each round; a language model's nucleus is usually found in the
first. The last round takes the whole row (a flat row whose nucleus is most of the vocabulary).
"""

from __future__ import annotations

import numpy as np

from calculet.daemon.sampling.rowmath import RowMath
from calculet.daemon.sampling.select import prefix_len, rank_order
from calculet.daemon.sampling.source import RowSource

FIRST_RANK = 64
GROWTH = 8


def nucleus(src: RowSource, top_p: float, rm: RowMath) -> tuple[np.ndarray, np.ndarray]:
    """The top-p prefix of the whole row, exactly as a full sort gives it.

    Args:
        src: the row.
        top_p: in (0, 1).
        rm: the row's math (its whole mass is computed here if it was not yet).

    Returns:
        `(ids, values)` of the nucleus in rank order (at least the argmax).
    """
    target = top_p * rm.mass().total
    rank = FIRST_RANK
    while True:
        ids, vals = src.upper_set(rank)
        order = rank_order(ids, vals)
        vals = vals[order]
        cum = np.cumsum(rm.probs(vals), dtype=np.float64)
        if ids.shape[0] >= src.size or cum[-1] >= target:
            cut = prefix_len(cum, target)
            return ids[order[:cut]], vals[:cut]
        rank *= GROWTH
