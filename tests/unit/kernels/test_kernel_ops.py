"""Properties of the forward's building blocks (ops.py)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calculet.daemon.calsim.kernels.ops import (
    causal_attention,
    decode_attention,
    moe_experts,
    rms_norm,
    rope,
    route,
    row_matmul,
    silu,
    tree_sum,
)

from .kernel_factories import same_bits

RNG = np.random.default_rng(0)


def test_rms_norm_gives_unit_rms_times_weight() -> None:
    x = RNG.standard_normal((5, 32)).astype(np.float32) * 7
    w = RNG.standard_normal(32).astype(np.float32)
    y = rms_norm(x, np.ones(32, np.float32), 1e-6)
    np.testing.assert_allclose(np.sqrt(np.mean(y**2, axis=-1)), 1.0, rtol=1e-5)
    np.testing.assert_allclose(rms_norm(x, w, 1e-6), y * w, rtol=1e-5)


@settings(max_examples=30, deadline=None)
@given(m=st.integers(0, 40000), n=st.integers(0, 40000), shift=st.integers(0, 1000))
def test_rope_scores_depend_only_on_relative_position(m: int, n: int, shift: int) -> None:
    q = RNG.standard_normal((1, 1, 16)).astype(np.float32)
    k = RNG.standard_normal((1, 1, 16)).astype(np.float32)

    def score(a: int, b: int) -> float:
        qa = rope(q, np.array([a]), 1e6)
        kb = rope(k, np.array([b]), 1e6)
        return float(np.sum(qa * kb))

    assert abs(score(m, n) - score(m + shift, n + shift)) < 1e-3
    # A rotation: norms are kept.
    np.testing.assert_allclose(np.linalg.norm(rope(q, np.array([m]), 1e6)), np.linalg.norm(q), rtol=1e-5)


def test_rope_at_position_zero_is_identity() -> None:
    x = RNG.standard_normal((1, 3, 8)).astype(np.float32)
    np.testing.assert_allclose(rope(x, np.array([0]), 1e6), x)


def test_silu_is_x_sigmoid_x_and_never_overflows() -> None:
    x = np.linspace(-20, 20, 101, dtype=np.float32)
    np.testing.assert_allclose(silu(x), x / (1 + np.exp(-x.astype(np.float64))), atol=1e-5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        big = silu(np.array([-1e4, 1e4], np.float32))
    np.testing.assert_allclose(big, [0.0, 1e4])


def test_causal_attention_ignores_future_slots() -> None:
    q = RNG.standard_normal((4, 4, 8)).astype(np.float32)
    k = RNG.standard_normal((2, 6, 8)).astype(np.float32)
    v = RNG.standard_normal((2, 6, 8)).astype(np.float32)
    slots = np.array([2, 3, 4, 5])
    base = causal_attention(q, k, v, slots)
    k2, v2 = k.copy(), v.copy()
    k2[:, 3:] += 5
    v2[:, 3:] += 5
    changed = causal_attention(q, k2, v2, slots)
    np.testing.assert_allclose(changed[0], base[0], rtol=1e-6)  # query at slot 2 never sees 3..5
    assert not np.allclose(changed[1], base[1])


def test_attention_over_one_slot_returns_that_value_for_every_head_of_its_group() -> None:
    q = RNG.standard_normal((1, 4, 8)).astype(np.float32)
    k = RNG.standard_normal((2, 1, 8)).astype(np.float32)
    v = RNG.standard_normal((2, 1, 8)).astype(np.float32)
    out = causal_attention(q, k, v, np.array([0]))
    np.testing.assert_allclose(out[0, :2], np.broadcast_to(v[0, 0], (2, 8)), rtol=1e-6)
    np.testing.assert_allclose(out[0, 2:], np.broadcast_to(v[1, 0], (2, 8)), rtol=1e-6)


@settings(max_examples=20, deadline=None)
@given(k=st.integers(1, 6), seed=st.integers(0, 1000))
def test_route_picks_the_top_k_with_renormalised_weights(k: int, seed: int) -> None:
    logits = np.random.default_rng(seed).standard_normal((7, 6)).astype(np.float32)
    experts, weights = route(logits, k)
    np.testing.assert_allclose(weights.sum(axis=-1), 1.0, rtol=1e-5)
    for t in range(7):
        assert set(experts[t]) == set(np.argsort(-logits[t])[:k])
    assert (weights > 0).all()


def test_moe_partials_over_disjoint_intermediate_slices_sum_to_the_full_output() -> None:
    e, h, i = 5, 8, 6
    x = RNG.standard_normal((9, h)).astype(np.float32)
    gate = RNG.standard_normal((e, h, i)).astype(np.float32)
    up = RNG.standard_normal((e, h, i)).astype(np.float32)
    down = RNG.standard_normal((e, i, h)).astype(np.float32)
    experts, weights = route(RNG.standard_normal((9, e)).astype(np.float32), 2)

    def part(cols: slice) -> np.ndarray:
        gate_up = np.concatenate([gate[:, :, cols], up[:, :, cols]], axis=2)
        return moe_experts(x, experts, weights, gate_up, down[:, cols, :])

    full = part(slice(0, i))
    np.testing.assert_allclose(part(slice(0, 3)) + part(slice(3, i)), full, rtol=1e-4, atol=1e-5)
    # And it is the routed sum of dense experts.
    t = 4
    want = sum(
        weights[t, j] * (silu(x[t] @ gate[experts[t, j]]) * (x[t] @ up[experts[t, j]])) @ down[experts[t, j]]
        for j in range(2)
    )
    np.testing.assert_allclose(full[t], want, rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------- exactness (issue 9, item 7)


def test_tree_sum_adds_aligned_pairs_level_by_level() -> None:
    x = RNG.standard_normal(7).astype(np.float32)
    want = ((x[0] + x[1]) + (x[2] + x[3])) + ((x[4] + x[5]) + x[6])
    assert same_bits(tree_sum(x), np.asarray(want, np.float32))
    m = RNG.standard_normal((4, 3)).astype(np.float32)
    assert same_bits(tree_sum(m, axis=1), ((m[:, 0] + m[:, 1]) + m[:, 2]).astype(np.float32))


_SPECIAL = st.sampled_from([0.0, -0.0, 1e-45, -1e-45, 3.0e38, -3.0e38, float("inf"), float("-inf"), float("nan")])
_VALUES = st.one_of(st.floats(-1e6, 1e6, width=32), _SPECIAL)


@settings(max_examples=200, deadline=None)
@given(values=st.lists(_VALUES, min_size=1, max_size=70), garbage=st.lists(_SPECIAL | _VALUES, max_size=70))
def test_tree_sum_of_a_prefix_ignores_whatever_follows_it(values: list[float], garbage: list[float]) -> None:
    prefix = np.array(values, np.float32)
    padded = np.array(values + garbage, np.float32)
    with np.errstate(all="ignore"):
        alone = tree_sum(prefix)
        assert same_bits(tree_sum(padded, lengths=np.array(len(values))), alone)
        # Per-element lengths: column j sums only its own prefix.
        grid = np.stack([padded, padded[::-1]], axis=1)
        sums = tree_sum(grid, lengths=np.array([len(values), len(padded)]))
        assert same_bits(sums[0], alone)
        assert same_bits(sums[1], tree_sum(padded[::-1]))


@pytest.mark.parametrize("t", [1, 2, 3, 8, 17, 64, 255])
def test_row_matmul_row_does_not_depend_on_the_other_rows(t: int) -> None:
    x = RNG.standard_normal((t, 64)).astype(np.float32)
    w = RNG.standard_normal((64, 48)).astype(np.float32)
    out = row_matmul(x, w)
    for i in {0, t // 2, t - 1}:
        assert same_bits(out[i], row_matmul(x[i : i + 1], w)[0])
    np.testing.assert_allclose(out, x @ w, rtol=1e-4, atol=1e-4)


def test_block_attention_gives_each_query_what_a_decode_step_gives_it() -> None:
    n, s = 37, 70
    q = RNG.standard_normal((n, 4, 16)).astype(np.float32)
    k = RNG.standard_normal((2, s, 16)).astype(np.float32)
    v = RNG.standard_normal((2, s, 16)).astype(np.float32)
    slots = np.arange(s - n, s)
    block = causal_attention(q, k, v, slots)
    for i in range(n):
        end = int(slots[i]) + 1
        alone = decode_attention(q[i : i + 1], k[None, :, :end], v[None, :, :end], np.array([end]))
        assert same_bits(block[i], alone[0]), f"query {i}"

    # Decode rows padded to a longer lane (garbage past each row's length) give the same bits.
    def lanes(x: np.ndarray) -> np.ndarray:
        return np.stack([np.concatenate([x, np.full((2, 9, 16), np.nan, np.float32)], axis=1)] * 3)

    rows = np.array([3, 20, 36])
    with np.errstate(all="ignore"):
        padded = decode_attention(q[rows], lanes(k), lanes(v), slots[rows] + 1)
    assert same_bits(padded, block[rows])


def test_moe_token_does_not_depend_on_the_other_tokens() -> None:
    e, h, i = 8, 16, 6
    x = RNG.standard_normal((40, h)).astype(np.float32)
    gate_up = RNG.standard_normal((e, h, 2 * i)).astype(np.float32)
    down = RNG.standard_normal((e, i, h)).astype(np.float32)
    experts, weights = route(RNG.standard_normal((40, e)).astype(np.float32), 2)
    many = moe_experts(x, experts, weights, gate_up, down)  # expert by expert
    for t in (0, 13, 39):
        one = moe_experts(x[t : t + 1], experts[t : t + 1], weights[t : t + 1], gate_up, down)  # gathered
        assert same_bits(many[t], one[0])


def test_route_breaks_ties_toward_the_lower_expert_and_lists_experts_ascending() -> None:
    logits = np.array([[1.0, 3.0, 3.0, 0.5, 3.0]], np.float32)
    experts, weights = route(logits, 2)
    assert experts.tolist() == [[1, 2]]
    assert weights[0, 0] == weights[0, 1]
    experts, _ = route(np.array([[5.0, 0.0, 9.0, 7.0]], np.float32), 3)
    assert experts.tolist() == [[0, 2, 3]]
