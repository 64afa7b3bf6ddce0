"""One chip of the numeric kernel: its tensor-parallel weight block and its share of the KV cache;
and the passes that run every chip's share at once.

Data flow per layer (driven by numeric.py): the kernel hands every chip the same normed
activations; each chip computes q/k/v for ITS heads, writes k/v into ITS cache, attends, and
returns a partial o-projection (`attention_partials` does this for all chips at once, their heads
side by side, with each element's arithmetic its chip's own); each chip runs every routed expert
over ITS slice of the intermediate dimension and returns a partial MoE output (`moe_partials`: few
tokens for all chips at once, the same way); the kernel sums partials (all-reduce), and computes
each chip's half of the vocab with that chip's `lm_head` rows, side by side in one product (gather).

Every product is summed by ops.py's trees (`row_matmul`, or the same tree with a chip axis) and
every attention goes through ops.py, so a row's result does not depend on the other rows, nor a
chip's on the other chip (see numeric.py, "Exactness").

Ownership: a `ChipShard` owns its weight arrays (read-only after load) and its KV arrays
`k_cache` / `v_cache` [lanes, layers, kv_heads_on_chip, lane_context, head_dim] (emulated device
memory). Which request a lane belongs to is the daemon's business; the shard writes the
(lane, slot) pairs it is given.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from calculet.daemon.calsim.kernels.ops import (
    MOE_GATHER_MAX_TOKENS,
    causal_attention,
    decode_attention,
    moe_experts,
    moe_gathered,
    rms_norm,
    rope_tables,
    rotate,
    row_matmul,
    tree_sum,
)
from calculet.daemon.calsim.kernels.weights import CHIPS
from calculet.daemon.package.manifest import Architecture


@dataclass(frozen=True)
class Segment:
    """Consecutive tokens of one call that go to one lane: rows `first..first+count-1` of the
    activations are written at slots `start..start+count-1` of `lane` and attend to slots
    0..(own slot) of that lane."""

    lane: int
    start: int
    first: int
    count: int


@dataclass(frozen=True)
class RowLayout:
    """Where a call's rows go, worked out once for every layer and chip of the call (`of`).

    Attributes:
        slots: int64 [T] KV slot of each row.
        segments: how rows map to lanes; rows of one segment are consecutive slots.
        lanes: int64 [T] lane of each row.
        rope: the rows' `rope_tables`.
        decode_rows, decode_lengths, decode_lanes: int64 [n] of the single-row segments (decode
            rows): their row, the slots each attends over (its slot + 1) and its lane; empty when
            there are none.
    """

    slots: np.ndarray
    segments: Sequence[Segment]
    lanes: np.ndarray
    rope: tuple[np.ndarray, np.ndarray]
    decode_rows: np.ndarray
    decode_lengths: np.ndarray
    decode_lanes: np.ndarray

    @classmethod
    def of(cls, positions: np.ndarray, slots: np.ndarray, segments: Sequence[Segment], arch: Architecture) -> RowLayout:
        """The layout of rows at RoPE `positions` [T] and KV `slots` [T] split into `segments`."""
        singles = [s for s in segments if s.count == 1]
        return cls(
            slots=slots,
            segments=segments,
            lanes=np.concatenate([np.full(s.count, s.lane, dtype=np.int64) for s in segments]),
            rope=rope_tables(positions, arch.head_dim, arch.rope_theta),
            decode_rows=np.array([s.first for s in singles], dtype=np.int64),
            decode_lengths=np.array([s.start + 1 for s in singles], dtype=np.int64),
            decode_lanes=np.array([s.lane for s in singles], dtype=np.int64),
        )


@dataclass(frozen=True)
class _Layer:
    w_qkv: np.ndarray  # [H, (q + 2 kv) * D]: this chip's wq | wk | wv columns, fused at load
    q_norm: np.ndarray
    k_norm: np.ndarray
    wo: np.ndarray  # [q * D, H]
    w_gate_up: np.ndarray  # [E, H, 2 * I/2]: this chip's gate | up slices, fused at load
    w_down: np.ndarray  # [E, I/2, H]


class ChipShard:
    """One chip: weights from its param block, KV for its kv heads.

    Args:
        chip: 0 or 1 (chip mask 1 << chip).
        block: the chip's tensors, already checked against `weights.chip_shapes(arch, chip)`.
        arch: full geometry.
        lanes, lane_context: KV lanes and slots per lane.
        kv_dtype: numpy dtype of the cache (float32 or bfloat16).
    """

    def __init__(
        self,
        chip: int,
        block: Mapping[str, np.ndarray],
        arch: Architecture,
        lanes: int,
        lane_context: int,
        kv_dtype: np.dtype,
    ) -> None:
        self.chip = chip
        self.arch = arch
        self.q_heads = arch.q_heads // CHIPS
        self.kv_heads = arch.kv_heads // CHIPS
        self.embed = block.get("embed")  # chip 0 only
        self.layers = [self._layer(block, f"layers.{i}.") for i in range(arch.layers)]
        shape = (lanes, arch.layers, self.kv_heads, lane_context, arch.head_dim)
        self.k_cache = np.zeros(shape, dtype=kv_dtype)
        self.v_cache = np.zeros(shape, dtype=kv_dtype)

    @staticmethod
    def _layer(block: Mapping[str, np.ndarray], p: str) -> _Layer:
        return _Layer(
            w_qkv=np.concatenate([block[p + "wq"], block[p + "wk"], block[p + "wv"]], axis=1),
            q_norm=block[p + "q_norm"],
            k_norm=block[p + "k_norm"],
            wo=block[p + "wo"],
            w_gate_up=np.concatenate([block[p + "w_gate"], block[p + "w_up"]], axis=2),
            w_down=block[p + "w_down"],
        )

    def moe(self, layer: int, h: np.ndarray, experts: np.ndarray, weights: np.ndarray) -> np.ndarray:
        """This chip's partial MoE output over its slice of every expert's intermediate dim.

        Returns:
            float32 [T, H], to be summed over chips.
        """
        w = self.layers[layer]
        return moe_experts(h, experts, weights, w.w_gate_up, w.w_down)

    def clear_lane(self, lane: int) -> None:
        self.k_cache[lane] = 0
        self.v_cache[lane] = 0

    def corrupt_lane(self, lane: int, rng: np.random.Generator) -> None:
        shape = self.k_cache[lane].shape
        self.k_cache[lane] = rng.standard_normal(shape, dtype=np.float32).astype(self.k_cache.dtype)
        self.v_cache[lane] = rng.standard_normal(shape, dtype=np.float32).astype(self.v_cache.dtype)

    @property
    def kv_bytes(self) -> int:
        return int(self.k_cache.nbytes + self.v_cache.nbytes)


@dataclass(frozen=True)
class FusedLayer:
    """One layer's weights of every chip side by side, for the passes that serve all chips at once
    (copies of the shards' own, made at load).

    Attributes:
        w_qkv: [H, chips * (q + 2 kv) * D]: each chip's q | k | v columns, chip by chip.
        wo: [chips, q * D, H]: each chip's o-projection.
        w_gate_up: [E, H, chips * 2 * I/2]: each chip's gate | up columns, chip by chip.
        w_down: [chips, E, I/2, H].
    """

    w_qkv: np.ndarray
    wo: np.ndarray
    w_gate_up: np.ndarray
    w_down: np.ndarray

    @classmethod
    def of(cls, chips: Sequence[ChipShard], layer: int) -> FusedLayer:
        """`layer`'s weights of `chips`, in chip order. A column's products and tree are its chip's
        own, so one product over the side-by-side columns gives every chip's result."""
        own = [c.layers[layer] for c in chips]
        return cls(
            w_qkv=np.concatenate([w.w_qkv for w in own], axis=1),
            wo=np.stack([w.wo for w in own]),
            w_gate_up=np.concatenate([w.w_gate_up for w in own], axis=2),
            w_down=np.stack([w.w_down for w in own]),
        )


def attention_partials(
    chips: Sequence[ChipShard], fused: FusedLayer, layer: int, h: np.ndarray, rows: RowLayout
) -> list[np.ndarray]:
    """Each chip's partial attention output for normed activations `h`, in chip order.

    Each chip writes k/v of every row into its own cache (row i at `rows.slots[i]` of its segment's
    lane), attends with its own heads over its own cache, and projects its heads' output with its
    own `wo`. The chips' heads go side by side through one projection, one q/k norm and rotation and
    one attention call per segment kind: query head h of chip c reads kv head h // group of chip c
    either way, and every element sees the same operations in the same order as a chip alone.
    Decode rows (single-row segments) attend together, each over its own lane up to its slot; a
    longer segment (a prefill) over its lane, each query up to its own slot (exactly what a decode
    step at that slot attends over).

    Args:
        chips: the shards, in chip order.
        fused: `FusedLayer.of(chips, layer)`.
        layer: layer index.
        h: float32 [T, H], attn-normed residual stream.
        rows: the call's rows: slots, segments, lanes and RoPE tables (`RowLayout.of`).

    Returns:
        float32 [T, H] per chip, to be summed over chips.
    """
    first = chips[0]
    w0 = first.layers[layer]  # q_norm and k_norm are replicated: every chip holds the same
    t, d, eps = h.shape[0], first.arch.head_dim, first.arch.rms_norm_eps
    qh, kvh = first.q_heads, first.kv_heads
    nq, nkv = qh * d, kvh * d
    qkv = row_matmul(h, fused.w_qkv).reshape(t, len(chips), nq + 2 * nkv)
    q = rotate(rms_norm(qkv[..., :nq].reshape(t, len(chips) * qh, d), w0.q_norm, eps), rows.rope)
    k = rotate(rms_norm(qkv[..., nq : nq + nkv].reshape(t, len(chips) * kvh, d), w0.k_norm, eps), rows.rope)
    v = qkv[..., nq + nkv :].reshape(t, len(chips) * kvh, d)
    heads = [slice(c * kvh, (c + 1) * kvh) for c in range(len(chips))]
    for chip, own in zip(chips, heads, strict=True):
        # Advanced indices around a slice put the row axis first: target shape [T, kv_heads, D].
        chip.k_cache[rows.lanes, layer, :, rows.slots] = k[:, own]
        chip.v_cache[rows.lanes, layer, :, rows.slots] = v[:, own]
    out = np.empty((t, len(chips) * qh, d), dtype=np.float32)
    if rows.decode_rows.size:
        # Decode rows: one query per lane, all lanes in one padded call (exact per row).
        end = int(rows.decode_lengths.max())
        kc = np.concatenate([c.k_cache[rows.decode_lanes, layer, :, :end] for c in chips], axis=1)
        vc = np.concatenate([c.v_cache[rows.decode_lanes, layer, :, :end] for c in chips], axis=1)
        out[rows.decode_rows] = decode_attention(
            q[rows.decode_rows], kc.astype(np.float32, copy=False), vc.astype(np.float32, copy=False),
            rows.decode_lengths,
        )  # fmt: skip
    for s in rows.segments:
        if s.count == 1:
            continue
        end = s.start + s.count
        kc = np.concatenate([c.k_cache[s.lane, layer, :, :end] for c in chips], axis=0)
        vc = np.concatenate([c.v_cache[s.lane, layer, :, :end] for c in chips], axis=0)
        span = slice(s.first, s.first + s.count)
        out[span] = causal_attention(
            q[span], kc.astype(np.float32, copy=False), vc.astype(np.float32, copy=False), rows.slots[span]
        )
    # Each chip's o-projection of its own heads: one tree over its q * D inputs per (chip, row, column).
    heads_out = out.reshape(t, len(chips), nq).transpose(2, 1, 0)[..., None]  # [q * D, chips, T, 1]
    return list(tree_sum(heads_out * fused.wo.transpose(1, 0, 2)[:, :, None, :]))  # [chips, T, H]


def moe_partials(
    chips: Sequence[ChipShard], fused: FusedLayer, layer: int, h: np.ndarray, experts: np.ndarray, weights: np.ndarray
) -> list[np.ndarray]:
    """Each chip's partial MoE output (`ChipShard.moe`), in chip order: few tokens for all chips in
    one gathered pass (`ops.moe_gathered`, each chip's arithmetic its own), many chip by chip."""
    if h.shape[0] <= MOE_GATHER_MAX_TOKENS:
        return list(moe_gathered(h, experts, weights, fused.w_gate_up, fused.w_down))
    return [c.moe(layer, h, experts, weights) for c in chips]
