"""The device's BF16 row read in place: checks, argmax and candidate sets on the raw 16-bit patterns.

Converting a whole BF16 row to FP32 costs a pass and 600 KB of cache; most rows need neither. A BF16
value is its sign bit, 8 exponent bits and 7 mantissa bits, so read as int16:
- non-negative values sort exactly like their int16 patterns, and every negative value's pattern is
  negative: for a POSITIVE bound b, `value >= b` is `bits >= ceil_bits(b)`, argmax over the int16
  view is the float argmax when the row's maximum is positive (equal positive values have equal bits,
  so ties still go to the lowest id), and group maxima bound the k-th largest as in `groups.py`;
- NaN and +-Inf are the patterns whose exponent bits are all ones: int16 >= 0x7F80 (+Inf, +NaN) or
  uint16 >= 0xFF80 (-Inf, -NaN). One argmax and one uint16 max find them.
Every query whose bound is not positive (a row without a positive logit, a min-p or nucleus threshold
at or below zero) is answered from the FP32 row, converted on first use into the sampler's workspace,
so each answer equals the `F32Row` answer for the converted row. Values handed out are FP32.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from calculet.daemon.sampling.groups import GroupMax
from calculet.daemon.sampling.source import F32Row, RowSource

BF16 = np.dtype(ml_dtypes.bfloat16)
POS_NONFINITE = 0x7F80  # int16 patterns >= this are +Inf or NaN with the sign bit clear
NEG_NONFINITE = 0xFF80  # uint16 patterns >= this are -Inf or NaN with the sign bit set


def to_float32(row: np.ndarray, out: np.ndarray) -> np.ndarray:
    """BF16 -> FP32 into `out` (float32, same length): a BF16 value is the high half of its FP32 value,
    so one widening shift is exact (NaN payloads included) and about 3x cheaper than a dtype cast."""
    np.left_shift(row.view(np.uint16), 16, out=out.view(np.uint32), dtype=np.uint32)
    return out


def ceil_bits(threshold: float) -> int:
    """The int16 pattern of the least BF16 value `>= threshold`, for a positive finite `threshold`
    (0x7F80, +Inf, when no finite BF16 value reaches it)."""
    nearest = np.asarray(threshold, dtype=np.float32).astype(BF16)
    bits = int(nearest.view(np.uint16))
    if float(nearest) < threshold:  # rounded down: the next pattern up is the next value up
        bits += 1
    return bits


class Bf16Row(RowSource):
    """A BF16 row read in place; falls back to an FP32 copy in `workspace` for non-positive bounds.

    Args:
        size: the row length (vocabulary size).
        group_size: prefilter group size (speed only).
        workspace: the sampler's float32 [size] row buffer (overwritten on the first FP32 query).
        mask: preallocated bool [size] scratch.
    """

    def __init__(self, size: int, group_size: int, workspace: np.ndarray, mask: np.ndarray) -> None:
        self.size = size
        self._group_size = group_size
        self._mask = mask
        self._workspace = workspace
        self._f32 = F32Row(size, group_size, mask)
        self._row = np.zeros(size, dtype=BF16)
        self._bits = self._row.view(np.int16)
        self._dense = False
        self._groups: GroupMax | None = None

    def load(self, row: np.ndarray) -> Bf16Row:
        """Serve `row` (bfloat16 [size], contiguous; the caller keeps it unchanged until the next load)."""
        self._row = row
        self._bits = row.view(np.int16)
        self._dense = False
        self._groups = None
        return self

    def finite_argmax(self) -> int | None:
        """Index of the first maximum, or None when the row holds a NaN or an infinity."""
        best = int(np.argmax(self._bits))
        if int(self._bits[best]) >= POS_NONFINITE or int(self._row.view(np.uint16).max()) >= NEG_NONFINITE:
            return None
        if self._bits[best] > 0:
            return best
        return int(np.argmax(self.dense()))  # no positive value: +0 and -0 tie, and negatives sort reversed

    def value(self, i: int) -> np.float32:
        return np.float32(self._row[i])

    def values(self, ids: np.ndarray) -> np.ndarray:
        return self._row[ids].astype(np.float32)

    def dense(self) -> np.ndarray:
        if not self._dense:
            to_float32(self._row, self._workspace)
            self._f32.load(self._workspace)
            self._dense = True
        return self._workspace

    def minus(self, m: np.float32, out: np.ndarray) -> np.ndarray:
        if self._dense:
            return super().minus(m, out)
        # Convert straight into `out`: the whole FP32 row is never needed when every bound is positive.
        return np.subtract(to_float32(self._row, out), m, out=out)

    def upper_set(self, rank: int) -> tuple[np.ndarray, np.ndarray]:
        bound = None if rank >= self.size else self._group_max().kth_bound(rank)
        if bound is None or int(bound) <= 0:
            self.dense()
            return self._f32.upper_set(rank)
        return self._gather(self._group_max().at_least(bound))

    def at_least(self, threshold: np.float32) -> tuple[np.ndarray, np.ndarray]:
        if not threshold > 0:
            self.dense()
            return self._f32.at_least(threshold)
        bits = ceil_bits(float(threshold))
        if bits >= POS_NONFINITE:
            empty = np.empty(0, dtype=np.intp)
            return empty, np.empty(0, dtype=np.float32)
        return self._gather(self._group_max().at_least(np.int16(bits)))

    def _gather(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return ids, self._row[ids].astype(np.float32)

    def _group_max(self) -> GroupMax:
        if self._groups is None:
            self._groups = GroupMax(self._bits, self._group_size, self._mask)
        return self._groups
