"""Numpy building blocks of the Qwen3-MoE forward, shared by the numeric kernel and the reference.

All functions are pure: float32 arrays in, fresh float32 arrays out. Activations are laid out
[tokens, ...]; attention keys/values are [kv_heads, slots, head_dim], the KV cache's own layout.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

_F32 = np.float32
KV_DTYPES: dict[str, np.dtype] = {"fp32": np.dtype(np.float32), "bf16": np.dtype(ml_dtypes.bfloat16)}


def kv_storage_dtype(name: str) -> np.dtype:
    """numpy dtype that stores KV for a manifest KV dtype name (one of `KV_DTYPES`).

    Raises:
        KeyError: any other name (callers turn it into their own typed error).
    """
    return KV_DTYPES[name]


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """RMSNorm over the last axis: `x / sqrt(mean(x^2) + eps) * weight`."""
    ms = np.mean(np.square(x), axis=-1, keepdims=True)
    return (x / np.sqrt(ms + _F32(eps)) * weight).astype(_F32, copy=False)


def rope(x: np.ndarray, positions: np.ndarray, theta: float) -> np.ndarray:
    """Rotary embedding, half-split ("rotate_half") form as in Qwen3/Llama.

    Args:
        x: float32 [T, heads, D], D even.
        positions: int [T].
        theta: rope base (rope_theta).

    Returns:
        float32 [T, heads, D].
    """
    d = x.shape[-1]
    half = d // 2
    inv_freq = theta ** (-np.arange(0, half, dtype=np.float64) * 2.0 / d)
    # Angles in float64: positions up to 40960 times frequencies near 1 lose phase in float32.
    angles = positions.astype(np.float64)[:, None] * inv_freq[None, :]
    cos = np.cos(angles).astype(_F32)[:, None, :]
    sin = np.sin(angles).astype(_F32)[:, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Numerically stable softmax; -inf entries get probability 0 (a row needs one finite entry)."""
    shifted = x - np.max(x, axis=axis, keepdims=True)
    e = np.exp(shifted)
    return (e / np.sum(e, axis=axis, keepdims=True)).astype(_F32, copy=False)


def silu(x: np.ndarray) -> np.ndarray:
    """x * sigmoid(x), via tanh so large |x| cannot overflow exp."""
    return (x * (_F32(0.5) * (_F32(1.0) + np.tanh(x * _F32(0.5))))).astype(_F32, copy=False)


def causal_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, q_slots: np.ndarray) -> np.ndarray:
    """GQA attention of queries over KV slots 0..S-1; query i sees slots <= q_slots[i].

    Args:
        q: float32 [n, q_heads, D] (already q-normed and rotated).
        k, v: float32 [kv_heads, S, D] (k already k-normed and rotated); q_heads % kv_heads == 0,
            query head h uses kv head h // (q_heads // kv_heads).
        q_slots: int [n], each in [0, S).

    Returns:
        float32 [n, q_heads, D].
    """
    n, hq, d = q.shape
    hkv, s, _ = k.shape
    group = hq // hkv
    qg = q.reshape(n, hkv, group, d).transpose(1, 2, 0, 3)  # [hkv, g, n, D]
    scores = np.matmul(qg, k[:, None].swapaxes(-1, -2)) * _F32(1.0 / np.sqrt(d))  # [hkv, g, n, S]
    future = np.arange(s)[None, :] > q_slots[:, None]  # [n, S]
    if future.any():
        scores = np.where(future, _F32(-np.inf), scores)
    out = np.matmul(softmax(scores), v[:, None])  # [hkv, g, n, D]
    return out.transpose(2, 0, 1, 3).reshape(n, hq, d)


def route(router_logits: np.ndarray, top_k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-k routing: softmax over experts, keep the k largest, renormalise their weights.

    Args:
        router_logits: float32 [T, E].
        top_k: experts per token.

    Returns:
        (experts int64 [T, k], weights float32 [T, k]) with each row's weights summing to 1.
    """
    probs = softmax(router_logits)
    experts = np.argpartition(-probs, top_k - 1, axis=-1)[:, :top_k]
    weights = np.take_along_axis(probs, experts, axis=-1)
    weights = weights / np.sum(weights, axis=-1, keepdims=True)
    return experts, weights.astype(_F32, copy=False)


def moe_experts(
    h: np.ndarray, experts: np.ndarray, weights: np.ndarray, w_gate_up: np.ndarray, w_down: np.ndarray
) -> np.ndarray:
    """Routed SiLU-GLU experts, grouped by expert: sum_k weights[t,k] * expert_{e[t,k]}(h[t]).

    With a slice of each expert's intermediate dimension this is one chip's partial output; the
    partials over disjoint slices sum to the full output (the GLU is elementwise per unit).

    Args:
        h: float32 [T, H].
        experts, weights: from `route`, [T, k].
        w_gate_up: float32 [E, H, 2*I] (gate columns then up columns).
        w_down: float32 [E, I, H].

    Returns:
        float32 [T, H].
    """
    out = np.zeros_like(h)
    inter = w_down.shape[1]
    for e in np.unique(experts):
        # Each token picks an expert at most once, so `rows` has no repeats and += is exact.
        rows, slot = np.nonzero(experts == e)
        gu = h[rows] @ w_gate_up[e]
        y = (silu(gu[:, :inter]) * gu[:, inter:]) @ w_down[e]
        out[rows] += weights[rows, slot, None] * y
    return out
