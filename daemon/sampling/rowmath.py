"""One row's scalars and probabilities: the row maximum, 1/T, `exp` of scaled logits, the full mass.

`RowMath` is built per row by the finisher (`row.py`) and handed to the selection steps; it computes
the whole row's probability mass at most once, and only when a step needs it (a draw over the whole
vocabulary, logprobs, or the nucleus search's exact fallback), because that mass costs an `exp` of
every logit. `RowScratch` is the full-vocabulary scratch those steps write into, allocated once per
sampler so no token page-faults in fresh temporaries.
"""

from __future__ import annotations

import numpy as np

from calculet.daemon.sampling.draw import FullMass, draw_full
from calculet.daemon.sampling.logprobs import divide_by_temperature, scaled
from calculet.daemon.sampling.source import RowSource

DEFAULT_BLOCK = 1024  # measured: fewer, longer block sums are cheaper; the draw scans one block


class RowScratch:
    """Full-vocabulary scratch for one row: float32 probabilities (zero-padded to whole blocks)
    and a bool mask. Allocated once; every row overwrites it."""

    def __init__(self, vocab_size: int, block: int = DEFAULT_BLOCK) -> None:
        padded = -(-vocab_size // block) * block
        self.block = block
        self.probs = np.zeros(padded, dtype=np.float32)  # [vocab:] stays 0 forever
        self.mask = np.empty(vocab_size, dtype=bool)


class RowMath:
    """The row's scalars, its probabilities on demand, and its full mass computed at most once.

    Args:
        src: the row.
        argmax: index of the row's first maximum.
        temperature: T (1.0 for greedy rows).
        scratch: where the full row's probabilities go.
    """

    def __init__(self, src: RowSource, argmax: int, temperature: float, scratch: RowScratch) -> None:
        self.src = src
        self.m = src.value(argmax)
        self.temperature = temperature
        self.inv_t = np.float32(1.0 / temperature)
        self._scratch = scratch
        self._mass: FullMass | None = None

    def probs(self, vals: np.ndarray) -> np.ndarray:
        """Unnormalised float32 probabilities `exp((vals - m) * (1/T))` of some logits of the row."""
        return np.exp(scaled(vals, self.m, self.inv_t))

    def mass(self) -> FullMass:
        """The whole row's mass by block; the row's probabilities are left in `scratch.probs`."""
        if self._mass is None:
            out = self._scratch.probs[: self.src.size]
            np.exp(divide_by_temperature(self.src.minus(self.m, out), self.inv_t), out=out)
            self._mass = FullMass.of(self._scratch.probs, self._scratch.block)
        return self._mass

    def draw_full(self, u: float) -> int:
        """Inverse-CDF draw over the whole row (no truncation) for the uniform `u`."""
        mass = self.mass()
        return draw_full(self._scratch.probs, mass, self._scratch.block, u)
