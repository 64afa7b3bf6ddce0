"""The daemon's near-device sampler: a batch of BF16 logits in, one token per row out.

Data flow of `Sampler.sample` (policy DEFAULT):
1. checks the logits' shape and dtype and every row before any work; a bad batch samples nothing;
2. per row, into ONE preallocated FP32 row buffer that is reused for every row and every call:
   `np.copyto(buffer, logits[r], casting="unsafe")` (BF16 -> FP32, no allocation), `argmax` and
   `min` (a non-finite min or max means NaN/Inf: an anomaly result, no token), penalties in place
   and the argmax again, then `RowFinisher.finish` (temperature, top-k, top-p, min-p, draw,
   logprobs; order and definitions in `row.py`). Each step is one vectorised numpy call over the
   vocabulary; per-row Python is O(1) calls plus O(k) candidate arrays.

Why row by row rather than one [B, vocab] conversion followed by batched passes: measured on our
2-core machines with a prototype of both layouts (bench/sampler_bench.py inputs), a 600 KB FP32
row stays in L2 across its convert/min/argmax/exp passes, while a [16, vocab] block (9.7 MB) is
re-read from L3/DRAM by every batched pass. Reusing one buffer made greedy 1.5-2x and top-k ~1.2x
cheaper per row at B=4 and 16, and the batched layout was never faster. Python overhead per row
is a few microseconds against 40-300 us of numpy work.

Policy SERIAL reproduces today's production path for `--policy serial` comparisons: a fresh
`astype(np.float32)` copy of the whole batch, then each row on its own with fresh scratch. It
calls the same row functions on the same float32 values, so it draws the same tokens.

Ownership: the caller owns `logits` (e.g. a JobContext's D2H buffer); the sampler reads it only
during the call and keeps no reference, so the buffer may return to its pool as soon as
`sample` returns. The row buffer and scratch belong to the Sampler: one Sampler serves one
thread (the executor's completion worker) and is not re-entrant.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from enum import Enum

import ml_dtypes
import numpy as np

from calculet.daemon.errors import InvalidArgument
from calculet.daemon.sampling.penalties import apply_penalties
from calculet.daemon.sampling.row import DEFAULT_BLOCK, DEFAULT_STRIDE, RowFinisher, RowScratch
from calculet.daemon.sampling.types import ANOMALY, RowResult, RowSampling

_ACCEPTED_DTYPES = (np.dtype(ml_dtypes.bfloat16), np.dtype(np.float32))


class SamplingPolicy(Enum):
    DEFAULT = "default"  # preallocated, cache-resident row buffer
    SERIAL = "serial"  # today's path: full fresh FP32 copy of the batch, fresh temporaries per row


class Sampler:
    """Samples rows of logits without allocating full-vocabulary arrays per token.

    Args:
        vocab_size: logits width (> 0).
        max_rows: largest batch `sample` accepts (> 0), normally the device's decode batch.
        policy: DEFAULT, or SERIAL (the baseline: same tokens, higher cost).
        stride: prefilter subsample stride (speed only; results do not depend on it).

    Raises:
        InvalidArgument: vocab_size, max_rows or stride is not positive.
    """

    def __init__(
        self,
        vocab_size: int,
        max_rows: int,
        *,
        policy: SamplingPolicy = SamplingPolicy.DEFAULT,
        stride: int = DEFAULT_STRIDE,
    ) -> None:
        for name, value in (("vocab_size", vocab_size), ("max_rows", max_rows), ("stride", stride)):
            if value < 1:
                raise InvalidArgument(f"{name}: must be positive, got {value}")
        self.vocab_size = vocab_size
        self.max_rows = max_rows
        self.policy = policy
        self._finisher = RowFinisher(vocab_size, stride, DEFAULT_BLOCK)
        self._row = np.empty(vocab_size, dtype=np.float32)
        self._scratch = RowScratch(vocab_size, DEFAULT_BLOCK)

    @property
    def workspace(self) -> np.ndarray:
        """The FP32 row buffer every row is converted into (exposed so tests can check reuse)."""
        return self._row

    def sample(self, logits: np.ndarray, rows: Sequence[RowSampling]) -> list[RowResult]:
        """Draw one token per row.

        Args:
            logits: [B, vocab] bfloat16 (or float32), row i belonging to `rows[i]`; read only.
            rows: per-row parameters, RNG step and history.

        Returns:
            one `RowResult` per row, in order; rows with NaN/Inf logits come back as anomalies.

        Raises:
            InvalidArgument: shape/dtype mismatch, B > max_rows, top_k > vocab, penalties without a
                history, or a history built for another vocabulary. Nothing is sampled then.
        """
        self._check(logits, rows)
        # Overflow to -inf in (x - max) / T is intended (probability 0); keep numpy quiet about it.
        with np.errstate(over="ignore"):
            if self.policy is SamplingPolicy.SERIAL:
                return self._sample_serial(logits, rows)
            return [self._sample_row(logits[r], row) for r, row in enumerate(rows)]

    def _sample_row(self, logits_row: np.ndarray, row: RowSampling) -> RowResult:
        x = self._row
        np.copyto(x, logits_row, casting="unsafe")
        best = int(np.argmax(x))  # NaN or +inf, if present, is what argmax returns
        if not (math.isfinite(float(x[best])) and math.isfinite(float(np.min(x)))):
            return ANOMALY
        if row.history is not None and row.params.has_penalties:
            apply_penalties(x, row.params, row.history)
            best = int(np.argmax(x))
        return self._finisher.finish(x, best, row, self._scratch)

    def _sample_serial(self, logits: np.ndarray, rows: Sequence[RowSampling]) -> list[RowResult]:
        full = logits.astype(np.float32)  # today's path: a fresh full-batch FP32 copy per token
        results: list[RowResult] = []
        for r, row in enumerate(rows):
            x = full[r]
            if not np.isfinite(x).all():
                results.append(ANOMALY)
                continue
            if row.history is not None and row.params.has_penalties:
                apply_penalties(x, row.params, row.history)
            scratch = RowScratch(self.vocab_size, DEFAULT_BLOCK)  # fresh temporaries per row, as today
            results.append(self._finisher.finish(x, int(np.argmax(x)), row, scratch))
        return results

    def _check(self, logits: np.ndarray, rows: Sequence[RowSampling]) -> None:
        if not isinstance(logits, np.ndarray) or logits.ndim != 2:
            raise InvalidArgument("logits: must be a 2-D numpy array [rows, vocab]")
        if logits.dtype not in _ACCEPTED_DTYPES:
            raise InvalidArgument(f"logits: dtype must be bfloat16 or float32, got {logits.dtype}")
        if logits.shape != (len(rows), self.vocab_size):
            raise InvalidArgument(
                f"logits: shape {logits.shape} does not match {len(rows)} rows x vocab {self.vocab_size}"
            )
        if len(rows) > self.max_rows:
            raise InvalidArgument(f"rows: {len(rows)} exceeds the sampler's max_rows {self.max_rows}")
        for i, row in enumerate(rows):
            p = row.params
            if p.top_k > self.vocab_size:
                raise InvalidArgument(
                    f"rows[{i}].params.top_k: {p.top_k} exceeds the vocabulary size {self.vocab_size}"
                )
            if p.has_penalties and row.history is None:
                raise InvalidArgument(f"rows[{i}].history: penalties need the generation's token history")
            if row.history is not None and row.history.vocab_size != self.vocab_size:
                raise InvalidArgument(
                    f"rows[{i}].history: built for vocab {row.history.vocab_size}, the sampler's is {self.vocab_size}"
                )
