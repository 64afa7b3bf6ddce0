"""Single-chip reference forward of the tiny Qwen3-MoE: full weights, no split, no KV cache.

Used by tests as the oracle for the tensor-parallel numeric kernel: the 2-chip forward through
its KV cache must match this plain forward over the whole sequence within fp32 tolerance.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from calculet.daemon.calsim.kernels.ops import (
    causal_attention,
    kv_storage_dtype,
    moe_experts,
    rms_norm,
    rope,
    route,
)
from calculet.daemon.calsim.kernels.weights import check_block, check_geometry, full_shapes
from calculet.daemon.package.manifest import Architecture


def reference_forward(
    weights: Mapping[str, np.ndarray],
    arch: Architecture,
    tokens: np.ndarray,
    positions: np.ndarray | None = None,
    kv_dtype: str = "fp32",
) -> np.ndarray:
    """Logits of every token of one sequence starting at KV slot 0.

    Args:
        weights: full weights (see weights.py for names and shapes).
        arch: the geometry.
        tokens: int [n], n >= 1.
        positions: int [n] RoPE positions; default 0..n-1.
        kv_dtype: "fp32" or "bf16"; K and V are rounded through it as a KV cache would store them.

    Returns:
        float32 [n, vocab_size]; row i is the logits after token i.
    """
    check_geometry(arch)
    check_block(weights, full_shapes(arch), "reference weights")
    store = kv_storage_dtype(kv_dtype)
    tokens = np.asarray(tokens, dtype=np.int64)
    n = tokens.shape[0]
    pos = np.arange(n) if positions is None else np.asarray(positions, dtype=np.int64)
    slots = np.arange(n)
    d, eps = arch.head_dim, arch.rms_norm_eps
    x = weights["embed"][tokens]
    for layer in range(arch.layers):
        p = f"layers.{layer}."
        h = rms_norm(x, weights[p + "attn_norm"], eps)
        q = (h @ weights[p + "wq"]).reshape(n, arch.q_heads, d)
        k = (h @ weights[p + "wk"]).reshape(n, arch.kv_heads, d)
        v = (h @ weights[p + "wv"]).reshape(n, arch.kv_heads, d)
        q = rope(rms_norm(q, weights[p + "q_norm"], eps), pos, arch.rope_theta)
        k = rope(rms_norm(k, weights[p + "k_norm"], eps), pos, arch.rope_theta)
        k = k.astype(store).astype(np.float32).transpose(1, 0, 2)
        v = v.astype(store).astype(np.float32).transpose(1, 0, 2)
        attn = causal_attention(q, k, v, slots).reshape(n, arch.q_heads * d)
        x = x + attn @ weights[p + "wo"]
        h2 = rms_norm(x, weights[p + "ffn_norm"], eps)
        experts, gates = route(h2 @ weights[p + "router"], arch.experts_per_token)
        gate_up = np.concatenate([weights[p + "w_gate"], weights[p + "w_up"]], axis=2)
        x = x + moe_experts(h2, experts, gates, gate_up, weights[p + "w_down"])
    out: np.ndarray = rms_norm(x, weights["final_norm"], eps) @ weights["lm_head"].T
    return out
