"""Numpy building blocks of the Qwen3-MoE forward, shared by the numeric kernel and the reference.

All functions are pure: float32 arrays in, fresh float32 arrays out. Activations are laid out
[tokens, ...]; attention keys/values are [kv_heads, slots, head_dim], the KV cache's own layout.

Exactness (issue 9, item 7): every result row is computed with the same float32 operations in the
same order whatever the other rows of the call are, how many there are, and whether the row comes
from a prefill block or a decode step. Two rules make that hold by construction:

* Every sum is `tree_sum`: a binary tree over ALIGNED pairs of slots, written out as elementwise
  numpy adds. Its order is fixed by this code, not by numpy's reduction machinery or a BLAS
  kernel (both may pick blocking from the array shape, i.e. from the batch). Products are numpy
  multiplies and sums are separate adds, so nothing is fused.
* A query attends over exactly its own slots: the tree over slots is given each query's length
  and sees -0.0 (the exact identity of IEEE addition) in every slot past it, so a prefill query
  at slot i, whose block holds later slots too, and a decode row padded to a longer neighbour's
  lane, sum exactly what a decode step at slot i sums over a lane of i + 1 slots.

Everything else is elementwise (IEEE-exact `+ - * / sqrt`, and `exp`/`tanh`/`cos`/`sin`, whose
per-element result numpy computes the same wherever the element sits in an array: checked by
tests/unit/kernels, which compare rows alone and in batches bit for bit) or order-free (`max`,
selection by a stable sort). Matrix products are therefore `row_matmul`, never `@`.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

_F32 = np.float32
KV_DTYPES: dict[str, np.dtype] = {"fp32": np.dtype(np.float32), "bf16": np.dtype(ml_dtypes.bfloat16)}
# Attention over a prefill block handles this many (query, slot, head_dim) products per chunk of
# queries, to bound the temporaries; chunking does not change any query's result.
_ATTENTION_CHUNK_ELEMENTS = 1 << 18
# moe_experts gathers expert slices per (token, expert) pair up to this many tokens, and goes
# expert by expert above (both the same arithmetic; the faster for the size).
MOE_GATHER_MAX_TOKENS = 16


def kv_storage_dtype(name: str) -> np.dtype:
    """numpy dtype that stores KV for a manifest KV dtype name (one of `KV_DTYPES`).

    Raises:
        KeyError: any other name (callers turn it into their own typed error).
    """
    return KV_DTYPES[name]


def tree_sum(x: np.ndarray, axis: int = 0, lengths: np.ndarray | None = None) -> np.ndarray:
    """Sum over `axis` by a fixed binary tree: level by level, node j adds the pair (2j, 2j+1).

    At level l a node covers the aligned block of slots [j * 2**l, (j + 1) * 2**l). Slots past
    the length (the axis size, or `lengths`) hold -0.0, the exact identity of IEEE addition
    (x + -0.0 == x for every x, +0.0 and -0.0 included), so every node that reaches past the length
    equals the same node over the length alone: the sum of a length-L prefix is the same bits
    whatever follows it, be it nothing (an axis of L slots) or anything (more slots, `lengths` = L).

    Args:
        x: float32 array with at least one slot on `axis`.
        axis: the axis summed away.
        lengths: optional int array broadcasting against `x`'s shape without `axis`; each result
            element sums only slots 0..length-1 (each length in 1..x.shape[axis]).

    Returns:
        float32, `x`'s shape without `axis` (broadcast with `lengths`); a fresh array.
    """
    p = np.asarray(x)
    if axis % p.ndim:
        axis %= p.ndim
        p = p.transpose((axis, *range(axis), *range(axis + 1, p.ndim)))
    shape = p.shape[1:]
    if lengths is not None:
        lengths = np.asarray(lengths, dtype=np.int64)
        shape = np.broadcast_shapes(shape, lengths.shape)
        p = p[: int(lengths.max())]  # slots past every length: -0.0 in any case
    n = p.shape[0]
    size = _tree_width(n)
    if lengths is not None or size != n:
        padded = np.full((size, *shape), -0.0, dtype=p.dtype)
        where = True if lengths is None else np.arange(n).reshape((-1,) + (1,) * len(shape)) < lengths
        np.copyto(padded[:n], p, where=where)
        p = padded
    return _pair_levels(p)


def _tree_width(n: int) -> int:
    """Slots of the tree over n slots: n rounded up to a power of two (the rest hold -0.0)."""
    return 1 << (n - 1).bit_length()


def _pair_levels(p: np.ndarray) -> np.ndarray:
    """The tree's levels over axis 0 of `p` (a power-of-two length): a fresh array."""
    while p.shape[0] > 1:
        p = p[0::2] + p[1::2]
    out: np.ndarray = np.array(p[0])
    return out


def row_matmul(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """`x @ w` with each output element `tree_sum` over k of `x[t, k] * w[k, n]`.

    Row t of the result depends on row t of `x` only, with the same arithmetic for any number of
    rows (unlike BLAS, whose kernels and blocking follow the matrix shape).

    Args:
        x: float32 [T, K].
        w: float32 [K, N].

    Returns:
        float32 [T, N].
    """
    return tree_sum(x.T[:, :, None] * w[:, None, :])


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """RMSNorm over the last axis: `x / sqrt(mean(x^2) + eps) * weight`."""
    ms = (tree_sum(np.square(x), axis=-1) / _F32(x.shape[-1]))[..., None]
    return (x / np.sqrt(ms + _F32(eps)) * weight).astype(_F32, copy=False)


def rope(x: np.ndarray, positions: np.ndarray, theta: float) -> np.ndarray:
    """Rotary embedding, half-split ("rotate_half") form as in Qwen3/Llama.

    Elementwise per (token, frequency): a token's result depends on its own position only.

    Args:
        x: float32 [T, heads, D], D even.
        positions: int [T].
        theta: rope base (rope_theta).

    Returns:
        float32 [T, heads, D].
    """
    return rotate(x, rope_tables(positions, x.shape[-1], theta))


def rope_tables(positions: np.ndarray, head_dim: int, theta: float) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of every (token, frequency) angle, float32 [T, 1, D/2] each: what `rotate` needs,
    computed once for every layer and chip of a call (they depend on the positions only)."""
    half = head_dim // 2
    inv_freq = theta ** (-np.arange(0, half, dtype=np.float64) * 2.0 / head_dim)
    # Angles in float64: positions up to 40960 times frequencies near 1 lose phase in float32.
    angles = positions.astype(np.float64)[:, None] * inv_freq[None, :]
    return np.cos(angles).astype(_F32)[:, None, :], np.sin(angles).astype(_F32)[:, None, :]


def rotate(x: np.ndarray, tables: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """`rope` of float32 x [T, heads, D] with its positions' `rope_tables`."""
    cos, sin = tables
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Numerically stable softmax (denominator by `tree_sum`); -inf entries get probability 0
    (a row needs one finite entry)."""
    shifted = x - np.max(x, axis=axis, keepdims=True)
    e = np.exp(shifted)
    return (e / np.expand_dims(tree_sum(e, axis=axis), axis)).astype(_F32, copy=False)


def silu(x: np.ndarray) -> np.ndarray:
    """x * sigmoid(x), via tanh so large |x| cannot overflow exp."""
    return (x * (_F32(0.5) * (_F32(1.0) + np.tanh(x * _F32(0.5))))).astype(_F32, copy=False)


def causal_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, q_slots: np.ndarray) -> np.ndarray:
    """GQA attention of queries over one lane's KV slots 0..S-1; query i sees slots 0..q_slots[i].

    A query's result is the same bits whatever the other queries are and however many slots
    follow its own: a query at slot p in a block of S > p + 1 slots gets exactly what
    `decode_attention` gives it over slots 0..p (a decode step). Queries go in chunks, each over
    the slots up to its last query (that bounds the temporaries and skips most masked work).

    Args:
        q: float32 [n, q_heads, D] (already q-normed and rotated).
        k, v: float32 [kv_heads, S, D] (k already k-normed and rotated); q_heads % kv_heads == 0,
            query head h uses kv head h // (q_heads // kv_heads).
        q_slots: int [n], each in [0, S).

    Returns:
        float32 [n, q_heads, D].
    """
    n, hq, d = q.shape
    slots = np.asarray(q_slots, dtype=np.int64)
    chunk = max(1, _ATTENTION_CHUNK_ELEMENTS // (hq * d * (int(np.max(slots)) + 1)))
    kt = k.transpose(2, 0, 1)[:, :, None, :]  # [D, hkv, 1, S]: every query reads the same lane
    vt = v.transpose(1, 0, 2)[:, :, None, :]  # [S, hkv, 1, D]
    out = np.empty((n, hq, d), dtype=_F32)
    for first in range(0, n, chunk):
        rows = slice(first, min(n, first + chunk))
        end = int(slots[rows].max()) + 1
        out[rows] = _attend(q[rows], kt[..., :end], vt[:end], slots[rows] + 1)
    return out


def decode_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """GQA attention of one query per row over that row's own lane; row i sees slots 0..lengths[i]-1.

    Rows' lanes are stacked and padded to the longest; padding (whatever the lane holds there)
    never reaches a result, so row i gets the same bits as alone over exactly its slots.

    Args:
        q: float32 [n, q_heads, D].
        k, v: float32 [n, kv_heads, S, D], S >= max(lengths).
        lengths: int [n], each in [1, S].

    Returns:
        float32 [n, q_heads, D].
    """
    kt = k.transpose(3, 1, 0, 2)  # [D, hkv, n, S]
    vt = v.transpose(2, 1, 0, 3)  # [S, hkv, n, D]
    return _attend(q, kt, vt, np.asarray(lengths, dtype=np.int64))


def _attend(q: np.ndarray, kt: np.ndarray, vt: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Attention of queries q [n, hq, D] over kt [D, hkv, m, S] / vt [S, hkv, m, D] (m = 1: shared
    by all queries, m = n: one lane per query); query i sees slots 0..lengths[i]-1."""
    n, hq, d = q.shape
    _, hkv, _, s = kt.shape
    group = hq // hkv
    qt = q.reshape(n, hkv, group, d).transpose(3, 1, 2, 0)  # [D, hkv, g, n]
    # scores[h, g, i, j]: tree over D of q[i] * k[j]; products laid out [D, hkv, g, n, S].
    scores = tree_sum(qt[..., None] * kt[:, :, None]) * _F32(1.0 / np.sqrt(d))  # [hkv, g, n, S]
    visible = np.arange(s)[None, :] < lengths[:, None]  # [n, S]
    scores = np.where(visible, scores, _F32(-np.inf))
    e = np.exp(scores - np.max(scores, axis=-1, keepdims=True))  # invisible slots: exactly 0
    et = e.transpose(3, 0, 1, 2)[..., None]  # [S, hkv, g, n, 1]
    # One tree over the slots sums e[i, j] * v[j] (D columns) and e[i, j] (the softmax
    # denominator, one more column). The terms are laid out [slots, hkv, g, n, D + 1] straight
    # into the tree's buffer, with -0.0 wherever query i does not see slot j: exactly
    # `tree_sum(terms, lengths=lengths[:, None])`, without its copies.
    terms = np.empty((_tree_width(s), hkv, group, n, d + 1), dtype=_F32)
    np.multiply(et, vt[:, :, None], out=terms[:s, ..., :d])
    terms[:s, ..., d:] = et
    np.copyto(terms[:s], _F32(-0.0), where=~visible.T[:, None, None, :, None])
    terms[s:] = _F32(-0.0)
    sums = _pair_levels(terms)  # [hkv, g, n, D + 1]
    out = sums[..., :d] / sums[..., d:]
    return out.transpose(2, 0, 1, 3).reshape(n, hq, d)


def route(router_logits: np.ndarray, top_k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-k routing: softmax over experts, keep the k largest, renormalise their weights.

    The k experts are the k largest logits (a stable sort: ties go to the lower id), listed in
    ascending id, so a row's choice and its weights' sum depend on that row only.

    Args:
        router_logits: float32 [T, E].
        top_k: experts per token.

    Returns:
        (experts int64 [T, k], weights float32 [T, k]) with each row's weights summing to 1.
    """
    probs = softmax(router_logits)
    experts = np.sort(np.argsort(-router_logits, axis=-1, kind="stable")[:, :top_k], axis=-1)
    weights = np.take_along_axis(probs, experts, axis=-1)
    weights = weights / tree_sum(weights, axis=-1)[:, None]
    return experts.astype(np.int64, copy=False), weights.astype(_F32, copy=False)


def moe_experts(
    h: np.ndarray, experts: np.ndarray, weights: np.ndarray, w_gate_up: np.ndarray, w_down: np.ndarray
) -> np.ndarray:
    """Routed SiLU-GLU experts: sum_k weights[t,k] * expert_{e[t,k]}(h[t]).

    With a slice of each expert's intermediate dimension this is one chip's partial output; the
    partials over disjoint slices sum to the full output (the GLU is elementwise per unit).

    A token's result depends on that token only: each (token, expert) pair goes through the
    expert as `row_matmul` rows do, and the token's experts are added in ascending expert id
    (route's order) into zeros. Few tokens gather each pair's expert slices (one pass for all);
    many tokens go expert by expert (weights shared by its rows). Both are the same arithmetic.

    Args:
        h: float32 [T, H].
        experts, weights: from `route`, [T, k], experts ascending in each row.
        w_gate_up: float32 [E, H, 2*I] (gate columns then up columns).
        w_down: float32 [E, I, H].

    Returns:
        float32 [T, H].
    """
    if h.shape[0] <= MOE_GATHER_MAX_TOKENS:
        return moe_gathered(h, experts, weights, w_gate_up, w_down[None])[0]
    inter = w_down.shape[1]
    out = np.zeros_like(h)
    for e in np.unique(experts):
        # Each token picks an expert at most once, so `rows` has no repeats and += is exact.
        rows, slot = np.nonzero(experts == e)
        gu = row_matmul(h[rows], w_gate_up[e])
        y = row_matmul(silu(gu[:, :inter]) * gu[:, inter:], w_down[e])
        out[rows] += weights[rows, slot, None] * y
    return out


def moe_gathered(
    h: np.ndarray, experts: np.ndarray, weights: np.ndarray, w_gate_up: np.ndarray, w_down: np.ndarray
) -> np.ndarray:
    """`moe_experts` for few tokens, for C chips at once: each chip's partial output over its slices.

    Each (token, expert) pair gathers its expert's slices (products [H, T, k, C*2I] and
    [I, C, T, k, H]: one row per pair and chip), and each chip's terms are added into zeros in the
    token's expert order; a chip's elements see the same operations in the same order as that chip
    alone.

    Args:
        h: float32 [T, H].
        experts, weights: from `route`, [T, k], experts ascending in each row.
        w_gate_up: float32 [E, H, C*2*I]: chip by chip, each chip's gate columns then up columns.
        w_down: float32 [C, E, I, H].

    Returns:
        float32 [C, T, H].
    """
    chips, _, inter, _ = w_down.shape
    gu = tree_sum(h.T[:, :, None, None] * w_gate_up.transpose(1, 0, 2)[:, experts])  # [T, k, C*2I]
    gu = gu.reshape(*gu.shape[:2], chips, 2 * inter).transpose(2, 0, 1, 3)  # [C, T, k, 2I]
    act = silu(gu[..., :inter]) * gu[..., inter:]  # [C, T, k, I]
    down = w_down.transpose(2, 0, 1, 3)[:, :, experts]  # [I, C, T, k, H]
    y = tree_sum(act.transpose(3, 0, 1, 2)[..., None] * down)  # [C, T, k, H]
    out = np.zeros((chips, *h.shape), dtype=h.dtype)
    for j in range(experts.shape[1]):
        out += weights[None, :, j, None] * y[:, :, j]
    return out
