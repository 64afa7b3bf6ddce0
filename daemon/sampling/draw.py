"""Inverse-CDF draws: one uniform u in [0, 1) picks a token from a distribution in token-id order.

Every draw walks the candidates in ascending token id and returns the first whose cumulative
mass exceeds `u * total`, so a draw is a pure function of (distribution, u). Cumulative sums
are float64 over float32 probabilities; a token of zero probability is never returned (the
rounding fallback picks the last token that still adds mass).

For the whole vocabulary a cumulative sum costs ~10x a plain sum, so `FullMass` sums fixed
blocks of `block` tokens (the workspace row is zero-padded to a multiple of it) and the draw
scans block sums, then one block.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class FullMass:
    """Unnormalised probability mass of a whole row, by block.

    Attributes:
        block_cum: float64 [blocks] cumulative block sums.
        total: the row's total mass (`block_cum[-1]`).
    """

    block_cum: np.ndarray
    total: float

    @staticmethod
    def of(padded_probs: np.ndarray, block: int) -> FullMass:
        """Sum `padded_probs` (float32, length a multiple of `block`, zero past the vocabulary)."""
        sums = padded_probs.reshape(-1, block).sum(axis=1)
        block_cum = np.cumsum(sums, dtype=np.float64)
        return FullMass(block_cum, float(block_cum[-1]))


def draw_candidates(ids: np.ndarray, probs: np.ndarray, u: float) -> int:
    """Pick from candidates `ids` (ascending) with unnormalised float32 `probs` (total > 0)."""
    cum = np.cumsum(probs, dtype=np.float64)
    return int(ids[_pick(cum, u * float(cum[-1]))])


def draw_full(padded_probs: np.ndarray, mass: FullMass, block: int, u: float) -> int:
    """Pick a token id from a whole row's probabilities (the row `mass` was computed from)."""
    target = u * mass.total
    b = _pick(mass.block_cum, target)
    before = float(mass.block_cum[b - 1]) if b else 0.0
    cum = np.cumsum(padded_probs[b * block : (b + 1) * block], dtype=np.float64)
    return b * block + _pick(cum, target - before)


def _pick(cum: np.ndarray, target: float) -> int:
    """First index whose cumulative mass exceeds `target`; past the end (rounding), the last index
    that adds mass."""
    i = int(np.searchsorted(cum, target, side="right"))
    if i >= cum.shape[0]:
        i = int(np.searchsorted(cum, cum[-1], side="left"))
    return i
