"""Sampling from a device's top-k output, exactly: the K largest logits of each row, the tail's
maximum and a finite flag, with the full row read only when the answer may lie outside them.

A package in `topk` logits mode (issue 22) has its decode jobs return, per row, the K highest-ranked
logits (rank: value descending, id ascending, as everywhere in `select.py`) with their ids, the
largest logit of the other V - K (the tail), and whether the row held any NaN or infinity. The full
row stays on the device until the job's output buffer is reused, and the host may read it then.

`TopkRow` is a `RowSource` over that output. It answers every query whose answer the top K and the
tail maximum determine, and raises `NeedFullRow` for any other:
- `value(i)` for a token of the top K, and `value_bound(i)` for any token (the tail maximum bounds
  one outside the top K);
- `upper_set(rank)`: the top-K elements above the tail maximum (an upper set of the ranking), when
  there are at least `rank` of them;
- `at_least(threshold)` for a threshold above the tail maximum;
- never `dense()` (the whole row: a draw's or the logprobs' normaliser, a nucleus without top-k).
So greedy, top-k <= K, min-p whose floor clears the tail, and most temperature draws finish from the
top K; logprobs, penalties, a top-p without top-k, and a temperature draw whose proposal lands in the
tail and is not rejected by the tail maximum's bound (`rejection.py`) read the row. Because the
finisher (`row.py`) is a pure function of the row's values, the seed and the step, a row that raised
is sampled again from its full row from scratch: the tokens and logprobs are those of the
full-logits path, whether or not the row was read.

`device_topk` is the reference of what the device computes (calsim uses it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from calculet.daemon.sampling.bf16 import BF16, Bf16Row
from calculet.daemon.sampling.row import DEFAULT_GROUP
from calculet.daemon.sampling.select import exactly_k
from calculet.daemon.sampling.source import RowSource


class NeedFullRow(Exception):  # a control signal inside the sampler, never raised past it
    """The top K and the tail maximum do not determine the answer: read the full row."""


@dataclass(frozen=True)
class TopkRows:
    """A decode job's top-k output for a batch of B rows.

    Attributes:
        ids: int [B, K], each row's K highest-ranked token ids in rank order.
        values: float32 [B, K], their logits (BF16 values widen to float32 exactly).
        tail_max: float32 [B], the largest logit outside the top K (-inf when K is the vocabulary).
        finite: bool [B], the row held no NaN or infinity (when False the rest is meaningless).
        vocab_size: V.
    """

    ids: np.ndarray
    values: np.ndarray
    tail_max: np.ndarray
    finite: np.ndarray
    vocab_size: int

    @property
    def k(self) -> int:
        return int(self.ids.shape[1])


def device_topk(logits: np.ndarray, k: int) -> TopkRows:
    """What a `topk` device job returns for `logits` (bfloat16 or float32 [B, V]): the reference.

    A bfloat16 row is read in place as the sampler reads it (`bf16.Bf16Row`: group maxima of the
    raw bits find the K + 1 highest-ranked candidates, so no full sort or full conversion): the top
    K, and the (K + 1)-th's value as the tail maximum. A float32 row takes the plain path. Both
    rank by (value descending, id ascending), so they agree (a test checks it).

    Raises:
        ValueError: not a 2-D array, or k outside 1..V.
    """
    if logits.ndim != 2 or not 1 <= k <= logits.shape[1]:
        raise ValueError(f"device_topk: need [B, V] logits and 1 <= k <= V, got {logits.shape} and k={k}")
    rows, vocab = logits.shape
    ids = np.zeros((rows, k), dtype=np.int64)
    values = np.zeros((rows, k), dtype=np.float32)
    tail_max = np.full(rows, -np.inf, dtype=np.float32)
    finite = np.zeros(rows, dtype=bool)
    reader = _bf16_reader(vocab) if logits.dtype == BF16 else None
    for r in range(rows):
        found = _row_topk(logits[r], k, reader)
        if found is None:
            continue
        finite[r] = True
        top_ids, top_vals = found
        ids[r], values[r] = top_ids[:k], top_vals[:k]
        if k < vocab:
            tail_max[r] = top_vals[k]
    return TopkRows(ids, values, tail_max, finite, vocab)


def _bf16_reader(vocab: int) -> Bf16Row:
    return Bf16Row(vocab, DEFAULT_GROUP, np.empty(vocab, dtype=np.float32), np.empty(vocab, dtype=bool))


def _row_topk(row: np.ndarray, k: int, reader: Bf16Row | None) -> tuple[np.ndarray, np.ndarray] | None:
    """The K + 1 (or V) highest-ranked (ids, values) of one row in rank order, or None when the row
    holds a NaN or an infinity."""
    want = min(k + 1, row.shape[0])
    if reader is not None:
        src = reader.load(np.ascontiguousarray(row))
        if src.finite_argmax() is None:
            return None
        top_ids, top_vals = src.top_k(want)
    else:
        x = np.asarray(row, dtype=np.float32)
        if not np.isfinite(x).all():
            return None
        top_ids, top_vals = exactly_k(np.arange(x.shape[0]), x, want)
    order = np.lexsort((top_ids, -top_vals))
    return top_ids[order], top_vals[order]


class TopkRow(RowSource):
    """One row of a `TopkRows` as a `RowSource` (module docstring). Reloaded per row; holds no
    reference to the batch after the next load."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._ids = np.zeros(0, dtype=np.intp)
        self._vals = np.zeros(0, dtype=np.float32)
        self._tail = np.float32(-np.inf)

    def load(self, top: TopkRows, r: int) -> TopkRow:
        by_id = np.argsort(top.ids[r], kind="stable")
        self._ids = top.ids[r][by_id].astype(np.intp)
        self._vals = top.values[r][by_id]
        self._tail = np.float32(top.tail_max[r])
        return self

    def value(self, i: int) -> np.float32:
        at = int(np.searchsorted(self._ids, i))
        if at == self._ids.shape[0] or self._ids[at] != i:
            raise NeedFullRow(f"token {i} is outside the top {self._ids.shape[0]}")
        return np.float32(self._vals[at])

    def value_bound(self, i: int) -> np.float32:
        at = int(np.searchsorted(self._ids, i))
        if at < self._ids.shape[0] and self._ids[at] == i:
            return np.float32(self._vals[at])
        return self._tail  # outside the top K: at most the tail's maximum

    def dense(self) -> np.ndarray:
        raise NeedFullRow("the whole row")

    def upper_set(self, rank: int) -> tuple[np.ndarray, np.ndarray]:
        if self._ids.shape[0] == self.size:
            return self._ids, self._vals
        keep = self._vals > self._tail
        if int(np.count_nonzero(keep)) < rank:
            raise NeedFullRow(f"fewer than {rank} of the top {self._ids.shape[0]} clear the tail")
        return self._ids[keep], self._vals[keep]

    def at_least(self, threshold: np.float32) -> tuple[np.ndarray, np.ndarray]:
        if not np.float32(threshold) > self._tail and self._ids.shape[0] < self.size:
            raise NeedFullRow("the threshold does not clear the tail")
        keep = self._vals >= np.float32(threshold)
        return self._ids[keep], self._vals[keep]


FullRowReader = Callable[[int], np.ndarray]


@dataclass
class TopkTally:
    """Rows sampled from their top K, and rows whose full row was read."""

    from_topk: int = 0
    full_reads: int = 0
