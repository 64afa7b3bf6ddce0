"""The compute kernel contract inside calsim: turns tokens + KV contents into logits.

calsim's engine (timing, banks, buffers, faults) is independent of what the model computes; a
`Kernel` owns one configured model's KV memory (lanes in emulated device memory) and computes
logits that are an exact function of the KV contents it attends over, so lost or crossed KV
always changes the output. Two implementations: `numeric` (a tiny Qwen3-MoE transformer in numpy,
tensor-parallel over 2 chips) and `synthetic` (any geometry, cheap logits from a hash chain of the
lane's token history). `make_kernel` picks one by the manifest's `kernel` field.

KV semantics follow the CSR registers of the real runtime: a row with `past_kv_len=p` and
`cur_seq_len=n` writes KV positions p..p+n-1 of its lane and attends over positions 0..p+n-1 of
that lane as stored now, trusting `p` (the device does not track lane lengths; the daemon does).

Exactness (what the daemon's promise that batched, recovered and failed-over runs give a solo
run's tokens rests on): a row's logits and the KV it writes are a function, bit for bit, of its
lane's KV contents and its own token and position only, whatever other rows share the call (how
many, which, in which order); and a prefill of n tokens, in one call or in chunks, writes the
same KV bits and returns the same last logits as n single-token decode steps. Both kernels keep
it (numeric: ops.py's fixed-order arithmetic; synthetic: exact integer hashing).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from calculet.daemon.package.manifest import PackageManifest


@dataclass(frozen=True)
class DecodeRow:
    """One active row of a decode job."""

    lane: int
    past_kv_len: int
    token: int
    position: int


class Kernel(ABC):
    """Logits and KV of one configured model.

    Args (of implementations' constructors, via `make_kernel`):
        manifest: the package manifest (geometry, kernel name, synthetic seed).
        package_dir: where weight files live.
        lanes / lane_context: KV lanes to allocate and tokens per lane.
    """

    vocab_size: int
    lanes: int
    lane_context: int

    @abstractmethod
    def prefill(self, lane: int, past_kv_len: int, tokens: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """Run `tokens` (int32 [n]) at `positions` (int32 [n]) into `lane` after `past_kv_len` tokens.

        Returns:
            float32 [vocab] logits of the last token (a fresh array the caller may keep).

        Raises:
            ValueError: lane out of range, empty tokens, or past_kv_len + n > lane_context.
        """

    @abstractmethod
    def decode(self, rows: Sequence[DecodeRow]) -> np.ndarray:
        """One token for each row, rows on distinct lanes.

        Returns:
            float32 [len(rows), vocab] logits.

        Raises:
            ValueError: a lane out of range or repeated, or past_kv_len + 1 > lane_context.
        """

    @abstractmethod
    def clear_lane(self, lane: int) -> None:
        """Zero a lane's KV (reset_configuration)."""

    @abstractmethod
    def corrupt_lane(self, lane: int, rng: np.random.Generator) -> None:
        """Overwrite a lane's KV with garbage (what a CCU exception mid-write leaves behind)."""

    @property
    @abstractmethod
    def kv_bytes(self) -> int:
        """Host bytes used to emulate this kernel's KV memory."""


def make_kernel(manifest: PackageManifest, package_dir: Path, lanes: int, lane_context: int) -> Kernel:
    """Build the kernel named by `manifest.kernel`.

    Raises:
        ValueError: unknown kernel name, or weight files missing/inconsistent.
    """
    if manifest.kernel == "synthetic":
        from calculet.daemon.calsim.kernels.synthetic import SyntheticKernel

        return SyntheticKernel(manifest, package_dir, lanes, lane_context)
    if manifest.kernel == "numeric":
        from calculet.daemon.calsim.kernels.numeric import NumericKernel

        return NumericKernel(manifest, package_dir, lanes, lane_context)
    raise ValueError(f"unknown calsim kernel {manifest.kernel!r} (known: numeric, synthetic)")
