"""The daemon's near-device sampler: a batch of BF16 logits in, one token per row out.

Data flow of `Sampler.sample` (policy DEFAULT):
1. checks the logits' shape and dtype and every row before any work; a bad batch samples nothing;
2. per row, a BF16 row without penalties is read in place (`bf16.Bf16Row`): one int16 argmax and
   one uint16 max find the maximum and any NaN/Inf (an anomaly result, no token); candidate sets
   come from group maxima of the raw bits and only candidates are converted to FP32. A row with
   penalties (or float32 logits) goes into ONE preallocated FP32 row buffer reused for every row
   and call: `bf16.to_float32(logits[r], buffer)` (BF16 -> FP32 by a widening shift, no allocation),
   `argmax` and `min` (non-finite -> anomaly), penalties in place and the argmax again;
3. `RowFinisher.finish` (temperature, top-k, top-p, min-p, draw, logprobs; order and definitions in
   `row.py`) reads either row through the same `RowSource` interface and draws the same tokens.
   Per-row Python is O(1) numpy calls plus O(candidates) arrays; the whole row's `exp` is computed
   only where the definition needs the row's whole mass: a draw without truncation, logprobs, and a
   top-p without top-k (its normaliser; `nucleus.py`).

Why row by row rather than one [B, vocab] conversion followed by batched passes: measured on our
2-core machines with a prototype of both layouts, a row stays in L2 across its passes, while a
[16, vocab] block (9.7 MB as FP32) is re-read from L3/DRAM by every batched pass, and the batched
layout was never faster. Costs per row: `bench/sampler_bench.py`.

A row with `allowed` (a constraint's mask) is finished over its masked view (`masked.py`): the
same steps on the logits with forbidden tokens at -inf, on every path.

`sample_topk` samples a top-k device output instead (`topk.py`): each row from its K largest
logits when they decide, else from its full row, read on demand; the same tokens either way.

Policy SERIAL reproduces the baseline's sampling for `--policy serial` comparisons: a fresh
`astype(np.float32)` copy of the whole batch, then each row on its own with fresh scratch. It
calls the same row functions on the same float32 values, so it draws the same tokens.

Ownership: the caller owns `logits` (e.g. a JobContext's D2H buffer); the sampler reads it only
during the call and keeps no reference past it (the BF16 source drops its view at the next load,
and never writes), so the buffer may return to its pool as soon as `sample` returns. The row
buffer and scratch belong to the Sampler: one Sampler serves one thread (the executor's
completion worker) and is not re-entrant.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from enum import Enum

import numpy as np

from calculet.common.errors import InvalidArgument
from calculet.daemon.sampling.bf16 import BF16, NEG_NONFINITE, POS_NONFINITE, Bf16Row, to_float32
from calculet.daemon.sampling.masked import MaskedRow
from calculet.daemon.sampling.penalties import apply_penalties
from calculet.daemon.sampling.row import DEFAULT_GROUP, RowFinisher
from calculet.daemon.sampling.rowmath import RowScratch
from calculet.daemon.sampling.source import F32Row, RowSource
from calculet.daemon.sampling.topk import FullRowReader, NeedFullRow, TopkRow, TopkRows, TopkTally
from calculet.daemon.sampling.types import ANOMALY, RowResult, RowSampling

_ACCEPTED_DTYPES = (BF16, np.dtype(np.float32))


class SamplingPolicy(Enum):
    DEFAULT = "default"  # preallocated, cache-resident row buffer
    SERIAL = "serial"  # today's path: full fresh FP32 copy of the batch, fresh temporaries per row


class Sampler:
    """Samples rows of logits without allocating full-vocabulary arrays per token.

    Args:
        vocab_size: logits width (> 0).
        max_rows: largest batch `sample` accepts (> 0), normally the device's decode batch.
        policy: DEFAULT, or SERIAL (the baseline: same tokens, higher cost).
        stride: prefilter group size, in elements (speed only; results do not depend on it).

    Raises:
        InvalidArgument: vocab_size, max_rows or stride is not positive.
    """

    def __init__(
        self,
        vocab_size: int,
        max_rows: int,
        *,
        policy: SamplingPolicy = SamplingPolicy.DEFAULT,
        stride: int = DEFAULT_GROUP,
    ) -> None:
        for name, value in (("vocab_size", vocab_size), ("max_rows", max_rows), ("stride", stride)):
            if value < 1:
                raise InvalidArgument(f"{name}: must be positive, got {value}")
        self.vocab_size = vocab_size
        self.max_rows = max_rows
        self.policy = policy
        self._group = stride
        self._finisher = RowFinisher(vocab_size)
        self._row = np.empty(vocab_size, dtype=np.float32)
        self._scratch = RowScratch(vocab_size)
        self._f32 = F32Row(vocab_size, stride, self._scratch.mask)
        self._bf16 = Bf16Row(vocab_size, stride, self._row, self._scratch.mask)
        self._topk = TopkRow(vocab_size)
        self._masked = MaskedRow(vocab_size)

    @property
    def workspace(self) -> np.ndarray:
        """The FP32 row buffer rows are converted into when they need FP32 (exposed so tests can check reuse)."""
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

    @staticmethod
    def finite(logits_row: np.ndarray) -> bool:
        """Whether a row of logits (bfloat16 or float32) holds no NaN or infinity: the check a row
        that is not sampled (a prefill chunk's) still gets, so a numeric fault never goes unseen."""
        if logits_row.dtype == BF16:
            bits = logits_row.view(np.int16)
            return int(bits.max()) < POS_NONFINITE and int(logits_row.view(np.uint16).max()) < NEG_NONFINITE
        return bool(np.isfinite(logits_row).all())

    def sample_topk(
        self, top: TopkRows, rows: Sequence[RowSampling], read_full: FullRowReader
    ) -> tuple[list[RowResult], TopkTally]:
        """Draw one token per row from a top-k device output (`topk.py`): the same results as
        `sample` on the full rows; a row's full logits are read (`read_full(r)`, bfloat16 or
        float32 [vocab]) only when its top K cannot decide.

        Raises:
            InvalidArgument: as `sample`, for the shapes of `top` and the rows' parameters.
        """
        self._check_topk(top, rows)
        tally = TopkTally()
        results: list[RowResult] = []
        with np.errstate(over="ignore"):
            for r, row in enumerate(rows):
                if not top.finite[r]:
                    results.append(ANOMALY)
                    continue
                p = row.params
                if p.greedy and p.logprobs is None and not p.has_penalties and row.allowed is None:
                    # What `finish` returns for such a row, without loading it: its argmax is the
                    # top K's first (rank order), so no argsort or copy of the row's K values.
                    results.append(RowResult(int(top.ids[r, 0])))
                    tally.from_topk += 1
                    continue
                if not p.has_penalties:
                    try:
                        src = self._topk.load(top, r)
                        results.append(self._finish(src, int(top.ids[r][0]), row))
                        tally.from_topk += 1
                        continue
                    except NeedFullRow:
                        pass
                tally.full_reads += 1
                results.append(self._sample_row(read_full(r), row))
        return results, tally

    def _check_topk(self, top: TopkRows, rows: Sequence[RowSampling]) -> None:
        if top.vocab_size != self.vocab_size or top.ids.ndim != 2 or top.ids.shape[0] != len(rows):
            raise InvalidArgument(
                f"top-k output: {top.ids.shape} rows x k for vocab {top.vocab_size} does not match "
                f"{len(rows)} rows x vocab {self.vocab_size}"
            )
        if not 1 <= top.k <= self.vocab_size:
            raise InvalidArgument(f"top-k output: k {top.k} outside 1..{self.vocab_size}")
        self._check_rows(rows)

    def _sample_row(self, logits_row: np.ndarray, row: RowSampling) -> RowResult:
        history = row.history if row.params.has_penalties else None
        if logits_row.dtype == BF16 and history is None:
            src = self._bf16.load(logits_row)
            found = src.finite_argmax()
            if found is None:
                return ANOMALY
            return self._finish(src, found, row)
        x = self._row
        if logits_row.dtype == BF16:
            to_float32(logits_row, x)
        else:
            np.copyto(x, logits_row)
        best = int(np.argmax(x))  # NaN or +inf, if present, is what argmax returns
        if not (math.isfinite(float(x[best])) and math.isfinite(float(np.min(x)))):
            return ANOMALY
        if history is not None:
            apply_penalties(x, row.params, history)
            best = int(np.argmax(x))
        return self._finish(self._f32.load(x), best, row)

    def _finish(self, src: RowSource, argmax: int, row: RowSampling) -> RowResult:
        """The finisher on the row, or on its masked view when the row is constrained (`masked.py`);
        `argmax` is the unmasked row's."""
        if row.allowed is None:
            return self._finisher.finish(src, argmax, row, self._scratch)
        masked = self._masked.load(src, row.allowed)
        return self._finisher.finish(masked, masked.argmax(), row, self._scratch)

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
            scratch = RowScratch(self.vocab_size)  # fresh temporaries per row, as today
            src: RowSource = F32Row(self.vocab_size, self._group, scratch.mask).load(x)
            best = int(np.argmax(x))
            if row.allowed is not None:
                masked = MaskedRow(self.vocab_size).load(src, row.allowed)
                src, best = masked, masked.argmax()
            results.append(self._finisher.finish(src, best, row, scratch))
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
        self._check_rows(rows)

    def _check_rows(self, rows: Sequence[RowSampling]) -> None:
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
            if row.allowed is not None and (
                row.allowed.shape != (self.vocab_size,) or row.allowed.dtype != np.bool_ or not row.allowed.any()
            ):
                raise InvalidArgument(f"rows[{i}].allowed: must be bool [{self.vocab_size}] allowing some token")
            if row.history is not None and row.history.vocab_size != self.vocab_size:
                raise InvalidArgument(
                    f"rows[{i}].history: built for vocab {row.history.vocab_size}, the sampler's is {self.vocab_size}"
                )
