"""Where the selection steps read one row of logits from: the `RowSource` interface and its float32 form.

A row is either a float32 array (the sampler's workspace after BF16 -> FP32 conversion and penalties,
or float32 logits) or the device's BF16 row read in place (`bf16.Bf16Row`). The finisher (`row.py`),
the nucleus search (`nucleus.py`) and the logprobs (`logprobs.py`) ask a source for candidate sets
and values only, so each source can answer from whatever is cheapest while the answers, and so the
drawn tokens, stay identical: every value a source returns is the float32 logit itself (BF16 -> FP32
is exact).

Data flow: a source is loaded with one row, answers queries for that row only, and keeps no reference
after the next load. Ids are always ascending intp arrays; values are float32 arrays of the same
length. Returned arrays may be read-only views into scratch: callers never write into them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np

from calculet.daemon.sampling.groups import GroupMax
from calculet.daemon.sampling.select import exactly_k


class RowSource(ABC):
    """One row of (penalised, finite) logits as the selection steps read it."""

    size: int

    @abstractmethod
    def value(self, i: int) -> np.float32:
        """The logit of token `i`.

        Args:
            i: token id in [0, size).

        Returns:
            the float32 logit.
        """

    def value_bound(self, i: int) -> np.float32:
        """An upper bound of token `i`'s logit that this source knows without reading more of the
        row: the value itself here; a source that does not hold every value may answer less (a
        top-k output: the tail's maximum for a token outside its top K).

        Args:
            i: token id in [0, size).

        Returns:
            a float32 `>= value(i)`.
        """
        return self.value(i)

    def values(self, ids: np.ndarray) -> np.ndarray:
        """The logits of several tokens (a source with a cheaper gather overrides this).

        Args:
            ids: token ids in [0, size).

        Returns:
            float32 [len(ids)], `value(i)` for each.
        """
        return np.asarray([self.value(int(i)) for i in ids], dtype=np.float32)

    @abstractmethod
    def dense(self) -> np.ndarray:
        """The whole row as float32 [size] (read only; a source may materialise it on first use).

        Returns:
            the row's float32 values.
        """

    def minus(self, m: np.float32, out: np.ndarray) -> np.ndarray:
        """`row - m` in float32 into `out` (float32 [size]), the first step of the row's probabilities.

        Args:
            m: the row maximum.
            out: where to write (not the source's own storage).

        Returns:
            `out`.
        """
        return np.subtract(self.dense(), m, out=out)

    @abstractmethod
    def upper_set(self, rank: int) -> tuple[np.ndarray, np.ndarray]:
        """An upper set of the ranking with at least `rank` elements: every element `>=` some value.

        Args:
            rank: the least number of elements wanted (>= 1).

        Returns:
            `(ids, values)`; the whole row when no cheap bound exists or `rank >= size`.
        """

    @abstractmethod
    def at_least(self, threshold: np.float32) -> tuple[np.ndarray, np.ndarray]:
        """Every element `>= threshold`, compared in float32.

        Args:
            threshold: inclusive lower bound (finite or -inf).

        Returns:
            `(ids, values)`, possibly empty.
        """

    def top_k(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Exactly the k highest-ranked elements (rank: value descending, id ascending), ids ascending.

        Args:
            k: how many (>= 1); k >= size keeps all.

        Returns:
            `(ids, values)` of min(k, size) elements.
        """
        ids, vals = self.upper_set(k)
        return exactly_k(ids, vals, k)


class F32Row(RowSource):
    """A float32 row, prefiltered by group maxima over the values.

    Args:
        size: the row length (vocabulary size).
        group_size: prefilter group size (speed only).
        mask: preallocated bool [size] scratch.
    """

    def __init__(self, size: int, group_size: int, mask: np.ndarray) -> None:
        self.size = size
        self._group_size = group_size
        self._mask = mask
        self._all: np.ndarray | None = None
        self._x = np.zeros(0, dtype=np.float32)
        self._groups: GroupMax | None = None

    def load(self, x: np.ndarray) -> F32Row:
        """Serve `x` (float32 [size], finite; the caller keeps it unchanged until the next load)."""
        self._x = x
        self._groups = None
        return self

    def value(self, i: int) -> np.float32:
        return np.float32(self._x[i])

    def values(self, ids: np.ndarray) -> np.ndarray:
        return self._x[ids]

    def dense(self) -> np.ndarray:
        return self._x

    def upper_set(self, rank: int) -> tuple[np.ndarray, np.ndarray]:
        bound = None if rank >= self.size else self._group_max().kth_bound(rank)
        if bound is None:
            return self._all_ids(), self._x
        ids = self._group_max().at_least(bound)
        return ids, self._x[ids]

    def at_least(self, threshold: np.float32) -> tuple[np.ndarray, np.ndarray]:
        ids = self._group_max().at_least(np.float32(threshold))
        return ids, self._x[ids]

    def _all_ids(self) -> np.ndarray:
        if self._all is None:
            self._all = np.arange(self.size)
            self._all.flags.writeable = False
        return self._all

    def _group_max(self) -> GroupMax:
        if self._groups is None:
            self._groups = GroupMax(self._x, self._group_size, self._mask)
        return self._groups
