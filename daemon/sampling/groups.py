"""The exact prefilter by group maxima: bound a row's k-th largest element, list the elements above a bound.

The row's first `size * cols` elements are viewed, without a copy, as a [size, cols] matrix; column j
is the group {j, j + cols, j + 2 cols, ...} of `size` elements. Their maxima are one vectorised pass
over the row. The k-th largest group maximum is a lower bound of the row's k-th largest element (k
distinct groups each hold an element at least that large), and a tight one: at vocab 151,936 with
64-element groups, about k + 1 elements of a language model's row pass it, where a strided subsample
let through thousands (docs/performance.md describes that older prefilter). Elements at or above a
bound lie in the groups whose maximum is at or above it, so only those columns are gathered and
compared; when most groups qualify, one full comparison into the caller's mask is cheaper. The last
`n - size * cols` elements (fewer than `size`) belong to no group and are always compared.

Works on any 1-D array whose element order is the ranking order of the values it stands for: float32
logits, or the raw int16 bits of positive bfloat16 logits (`bf16.py`). Results never depend on the
group size; only the cost does.
"""

from __future__ import annotations

import numpy as np


class GroupMax:
    """Group maxima of one row, computed once, and the two queries they answer.

    Args:
        row: 1-D array (float32 values, or int16 bits ordered like the values they encode); read only,
            and it must not change while this object is used.
        size: elements per group (>= 1; clipped to the row length).
        mask: preallocated bool scratch, at least as long as `row`; overwritten by `at_least`.
    """

    def __init__(self, row: np.ndarray, size: int, mask: np.ndarray) -> None:
        n = row.shape[0]
        size = max(1, min(size, n))
        self.cols = n // size
        self._row = row
        self._mask = mask[:n]
        self._body = row[: size * self.cols].reshape(size, self.cols)
        self._rest_start = size * self.cols
        self.maxima = self._body.max(axis=0)
        self._size = size

    def _row_offsets(self) -> np.ndarray:
        """Start of each row of the [size, cols] body in the flat row."""
        return np.arange(0, self._size * self.cols, self.cols, dtype=np.int32)

    def kth_bound(self, k: int) -> np.generic | None:
        """A lower bound of the row's k-th largest element, or None when there are fewer than k groups."""
        if k > self.cols:
            return None
        pos = self.cols - k
        return np.partition(self.maxima, pos)[pos]

    def at_least(self, bound: np.generic) -> np.ndarray:
        """Ids (ascending, intp) of the elements `>= bound`, compared in the row's dtype."""
        hit = np.flatnonzero(self.maxima >= bound)
        if 4 * hit.shape[0] > self.cols:
            np.greater_equal(self._row, bound, out=self._mask)
            return np.flatnonzero(self._mask)
        # Element r * cols + c of the body is row r of column c: with `hit` ascending, these positions
        # ascend, so the kept ids come out ascending.
        positions = (self._row_offsets()[:, None] + hit.astype(np.int32)).ravel()  # int32: half the bytes
        ids = positions[self._row[positions] >= bound].astype(np.intp)
        rest = self._row[self._rest_start :]
        if rest.shape[0]:
            ids = np.concatenate((ids, self._rest_start + np.flatnonzero(rest >= bound)))
        return ids
