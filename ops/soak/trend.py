"""Theil-Sen line: the median of the pairwise slopes and the median intercept.

Used for drift (`drift.py`): a robust fit through per-window p99s, which a few windows hit by a
fault cannot tilt (its breakdown point is about 29 % of the points; least squares has none). Pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Line:
    """`y = intercept + slope * x`."""

    slope: float
    intercept: float

    def at(self, x: float) -> float:
        return self.intercept + self.slope * x


def theil_sen(xs: Sequence[float], ys: Sequence[float]) -> Line:
    """The Theil-Sen line through the points (pairs with equal x are skipped).

    Raises:
        ValueError: fewer than two points, lengths differ, or every x is the same.
    """
    if len(xs) != len(ys) or len(xs) < 2:
        raise ValueError(f"theil_sen: need two or more (x, y) pairs, got {len(xs)} x and {len(ys)} y")
    x = np.asarray(xs, dtype=np.float64)
    y = np.asarray(ys, dtype=np.float64)
    i, j = np.triu_indices(len(x), 1)
    dx = x[j] - x[i]
    keep = dx != 0
    if not keep.any():
        raise ValueError("theil_sen: every x is the same")
    slope = float(np.median((y[j] - y[i])[keep] / dx[keep]))
    return Line(slope, float(np.median(y - slope * x)))
