"""A calsim fault: a prefill graph that ignores `past_kv_len` (the `prefill_ignores_offset` option).

docs/sources.md 000 §5.3 allows a prompt split only where the calbin supports the incremental
semantics, and a calbin compiled for fresh prompts would not say when it lacks them. This kernel
wraps the package's own and models that calbin: every prefill row runs as if its lane were empty
(`past_kv_len` 0): its tokens attend over themselves only and their KV lands at slots 0..n-1, over
whatever the lane held. Decode steps are untouched, so a prompt prefilled in one job at offset 0
gives exactly the true answer, and only a prefill at an offset (a chunk after the first, a prefix
reused, a jump-forward) goes wrong, with no error. The load's offset check (`daemon/core/offset_probe.py`)
is what must notice.

Owner: the `CalsimDevice` that built it, per configured model (as the kernel it wraps).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from calculet.daemon.calsim.kernel import DecodeRow, Kernel


class OffsetBlindKernel(Kernel):
    """`inner` with every prefill run at offset 0 (module docstring).

    Args:
        inner: the package's kernel.
    """

    def __init__(self, inner: Kernel) -> None:
        self.inner = inner
        self.vocab_size = inner.vocab_size
        self.lanes = inner.lanes
        self.lane_context = inner.lane_context

    def prefill(self, lane: int, past_kv_len: int, tokens: np.ndarray, positions: np.ndarray) -> np.ndarray:
        # The fault: the offset is dropped, the positions the daemon staged are kept.
        return self.inner.prefill(lane, 0, tokens, positions)

    def decode(self, rows: Sequence[DecodeRow]) -> np.ndarray:
        return self.inner.decode(rows)

    def clear_lane(self, lane: int) -> None:
        self.inner.clear_lane(lane)

    def corrupt_lane(self, lane: int, rng: np.random.Generator) -> None:
        self.inner.corrupt_lane(lane, rng)

    @property
    def kv_bytes(self) -> int:
        return self.inner.kv_bytes
