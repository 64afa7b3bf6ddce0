"""The numeric calsim kernel: a tiny Qwen3-MoE forward in numpy, tensor parallel over 2 chips.

Data flow of one call: validate (nothing is written on a refused call) -> embedding on chip 0 ->
per layer: RMSNorm -> each chip's partial attention (its q/kv heads, its KV cache) -> all-reduce
(sum) -> residual -> RMSNorm -> router top-k -> each chip's partial MoE (its slice of every
expert) -> all-reduce -> residual -> final RMSNorm -> each chip's vocab half -> gather (concat).

Replicated work (norms, router) has the same weights and the same input on both chips, so it is
computed once here rather than twice; the result is identical. Weights come from the package's
`param_blk0.bin` / `param_blk1.bin` (weights.py documents names, shapes and the split); the
replicated tensors must be equal in both blocks.

Exactness (the daemon's promise that batched, recovered and failed-over runs give a solo run's
tokens): each row's logits and KV are the same bits whatever else is in the call. Every reduction
is ops.py's fixed tree (no BLAS, whose blocking follows the batch shape), decode rows attend over
exactly their own slots, and a prefill position attends over exactly the slots a decode step at
that position would, so a prefill of n tokens writes the KV and yields the last logits that n
decode steps would (ops.py's module docstring has the argument).

Ownership: the kernel owns its two `ChipShard`s and through them all KV memory, and each layer's
`FusedLayer` (the chips' weights side by side, read-only after load). It trusts
`past_kv_len` like the device does. One caller at a time (calsim's compute unit); not thread-safe.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from calculet.daemon.calsim.kernel import DecodeRow, Kernel
from calculet.daemon.calsim.kernels.errors import KernelConfigError
from calculet.daemon.calsim.kernels.ops import KV_DTYPES, rms_norm, route, row_matmul
from calculet.daemon.calsim.kernels.shard import (
    ChipShard,
    FusedLayer,
    RowLayout,
    Segment,
    attention_partials,
    moe_partials,
)
from calculet.daemon.calsim.kernels.validation import Bounds, check_decode, check_lane, check_prefill
from calculet.daemon.calsim.kernels.weights import (
    CHIPS,
    check_block,
    check_geometry,
    chip_shapes,
    load_param_block,
    param_block_name,
    replicated_names,
)
from calculet.daemon.package.manifest import PackageManifest


class NumericKernel(Kernel):
    """Tensor-parallel tiny Qwen3-MoE over 2 emulated chips (see the module docstring).

    Args:
        manifest: geometry (`architecture`), topology (must be 2 chips) and KV dtype (fp32/bf16).
        package_dir: holds `param_blk0.bin` and `param_blk1.bin`.
        lanes: KV lanes to allocate (>= 1).
        lane_context: KV slots per lane (>= 1).

    Raises:
        KernelConfigError: unsupported geometry/topology/KV dtype, or weight files missing or
            inconsistent with the manifest.
    """

    def __init__(self, manifest: PackageManifest, package_dir: Path, lanes: int, lane_context: int) -> None:
        arch = manifest.architecture
        check_geometry(arch)
        if manifest.topology.chips != CHIPS:
            raise KernelConfigError(
                f"numeric kernel: runs on {CHIPS} chips, manifest topology has {manifest.topology.chips}"
            )
        if manifest.kv.dtype not in KV_DTYPES:
            raise KernelConfigError(
                f"numeric kernel: kv.dtype {manifest.kv.dtype!r} unsupported (use one of {sorted(KV_DTYPES)})"
            )
        for name, value in (("lanes", lanes), ("lane_context", lane_context)):
            if value < 1:
                raise KernelConfigError(f"numeric kernel: {name} must be >= 1, got {value}")
        self.arch = arch
        self.vocab_size = arch.vocab_size
        self.lanes = lanes
        self.lane_context = lane_context
        self._bounds = Bounds(arch.vocab_size, lanes, lane_context)
        blocks = [self._load_block(Path(package_dir), chip) for chip in range(CHIPS)]
        self._check_replicated(blocks)
        self._embed: np.ndarray = blocks[0]["embed"]
        self._norms = [
            (blocks[0][f"layers.{i}.attn_norm"], blocks[0][f"layers.{i}.ffn_norm"]) for i in range(arch.layers)
        ]
        self._routers = [blocks[0][f"layers.{i}.router"] for i in range(arch.layers)]
        self._final_norm = blocks[0]["final_norm"]
        # Both chips' vocab halves side by side, in chip order (the gather): each column its chip's own.
        self._lm_head_t = np.ascontiguousarray(np.concatenate([b["lm_head"] for b in blocks]).T)  # [H, V]
        kv_dtype = KV_DTYPES[manifest.kv.dtype]
        self.chips = [ChipShard(c, blocks[c], arch, lanes, lane_context, kv_dtype) for c in range(CHIPS)]
        self._fused = [FusedLayer.of(self.chips, layer) for layer in range(arch.layers)]

    def _load_block(self, package_dir: Path, chip: int) -> dict[str, np.ndarray]:
        path = package_dir / param_block_name(chip)
        block = load_param_block(path)
        check_block(block, chip_shapes(self.arch, chip), f"{path} (chip {chip}, mask {1 << chip})")
        return block

    def _check_replicated(self, blocks: Sequence[dict[str, np.ndarray]]) -> None:
        differ = [n for n in replicated_names(self.arch) if not np.array_equal(blocks[0][n], blocks[1][n])]
        if differ:
            raise KernelConfigError(
                f"numeric kernel: replicated tensors differ between {param_block_name(0)} and "
                f"{param_block_name(1)}: {', '.join(differ)}"
            )

    def prefill(self, lane: int, past_kv_len: int, tokens: np.ndarray, positions: np.ndarray) -> np.ndarray:
        tok, pos = check_prefill(self._bounds, lane, past_kv_len, tokens, positions)
        n = tok.shape[0]
        slots = np.arange(past_kv_len, past_kv_len + n, dtype=np.int64)
        x = self._forward(tok, pos, slots, [Segment(lane, past_kv_len, 0, n)])
        # Only the last token's logits leave the device (docs/sources.md 003 §5: the last-row tile).
        return self._logits(x[-1:])[0]

    def decode(self, rows: Sequence[DecodeRow]) -> np.ndarray:
        b = check_decode(self._bounds, rows)
        segments = [Segment(int(b.lanes[i]), int(b.past[i]), i, 1) for i in range(len(b))]
        x = self._forward(b.tokens, b.positions, b.past, segments)
        return self._logits(x)

    def _forward(
        self, tokens: np.ndarray, positions: np.ndarray, slots: np.ndarray, segments: Sequence[Segment]
    ) -> np.ndarray:
        """Residual stream after the last layer, float32 [T, H]; writes KV of every row."""
        eps = self.arch.rms_norm_eps
        rows = RowLayout.of(positions, slots, segments, self.arch)  # the same for every layer and chip
        x = self._embed[tokens]  # chip 0's embedding, sent to chip 1
        for layer, ((attn_norm, ffn_norm), router) in enumerate(zip(self._norms, self._routers, strict=True)):
            h = rms_norm(x, attn_norm, eps)
            x = x + _all_reduce(attention_partials(self.chips, self._fused[layer], layer, h, rows))
            h = rms_norm(x, ffn_norm, eps)
            experts, gates = route(row_matmul(h, router), self.arch.experts_per_token)
            x = x + _all_reduce(moe_partials(self.chips, self._fused[layer], layer, h, experts, gates))
        return x

    def _logits(self, x: np.ndarray) -> np.ndarray:
        h = rms_norm(x, self._final_norm, self.arch.rms_norm_eps)
        return row_matmul(h, self._lm_head_t)

    def clear_lane(self, lane: int) -> None:
        check_lane(self._bounds, lane, "clear_lane")
        for c in self.chips:
            c.clear_lane(lane)

    def corrupt_lane(self, lane: int, rng: np.random.Generator) -> None:
        check_lane(self._bounds, lane, "corrupt_lane")
        for c in self.chips:
            c.corrupt_lane(lane, rng)

    @property
    def kv_bytes(self) -> int:
        return sum(c.kv_bytes for c in self.chips)


def _all_reduce(partials: Sequence[np.ndarray]) -> np.ndarray:
    """Sum of the chips' partial outputs (what the inter-chip all-reduce delivers to both chips)."""
    total = partials[0].copy()
    for p in partials[1:]:
        total += p
    return total
