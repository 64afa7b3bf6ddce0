"""Tiny weights: generation, the 2-chip tensor-parallel split and the param block files."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calculet.daemon.calsim.kernels.errors import KernelConfigError
from calculet.daemon.calsim.kernels.weights import (
    chip_shapes,
    full_shapes,
    generate_tiny_weights,
    load_param_block,
    replicated_names,
    save_param_block,
    split_for_chips,
)

from .kernel_factories import TINY_ARCH

# Where each split tensor's halves are concatenated back (the inverse of the documented split).
CONCAT_AXIS = {"wq": 1, "wk": 1, "wv": 1, "wo": 0, "w_gate": 2, "w_up": 2, "w_down": 1, "lm_head": 0}


def test_generation_is_deterministic_per_seed_and_matches_the_shapes() -> None:
    a, b, c = (generate_tiny_weights(TINY_ARCH, s) for s in (1, 1, 2))
    assert {n: w.shape for n, w in a.items()} == full_shapes(TINY_ARCH)
    assert all(w.dtype == np.float32 for w in a.values())
    assert all(np.array_equal(a[n], b[n]) for n in a)
    assert not np.array_equal(a["lm_head"], c["lm_head"])


@settings(max_examples=15, deadline=None)
@given(
    q_groups=st.integers(1, 3),
    kv_pairs=st.integers(1, 2),
    head_half=st.integers(1, 4),
    experts=st.integers(1, 5),
    inter_half=st.integers(1, 6),
    vocab_half=st.integers(1, 40),
)
def test_split_halves_reassemble_to_the_full_weights(
    q_groups: int, kv_pairs: int, head_half: int, experts: int, inter_half: int, vocab_half: int
) -> None:
    arch = replace(
        TINY_ARCH, layers=1, hidden_size=8, kv_heads=2 * kv_pairs, q_heads=2 * kv_pairs * q_groups,
        head_dim=2 * head_half, experts=experts, experts_per_token=1, expert_intermediate=2 * inter_half,
        vocab_size=2 * vocab_half,
    )  # fmt: skip
    full = generate_tiny_weights(arch, 0)
    chip0, chip1 = split_for_chips(full, arch)
    assert {n: w.shape for n, w in chip0.items()} == chip_shapes(arch, 0)
    assert {n: w.shape for n, w in chip1.items()} == chip_shapes(arch, 1)
    assert "embed" in chip0 and "embed" not in chip1
    for name, w in full.items():
        leaf = name.rsplit(".", 1)[-1]
        if name == "embed":
            assert np.array_equal(chip0[name], w)
        elif leaf in CONCAT_AXIS:
            assert np.array_equal(np.concatenate([chip0[name], chip1[name]], axis=CONCAT_AXIS[leaf]), w)
            assert chip0[name].shape != w.shape  # really halved
        else:
            assert name in replicated_names(arch)
            assert np.array_equal(chip0[name], w) and np.array_equal(chip1[name], w)


def test_each_chip_gets_whole_heads_of_its_own_kv_group() -> None:
    """Chip c's q heads use exactly chip c's kv heads under GQA (q head h -> kv head h // group)."""
    arch = replace(TINY_ARCH, q_heads=8, kv_heads=2)
    full = generate_tiny_weights(arch, 0)
    chip0, chip1 = split_for_chips(full, arch)
    d, group = arch.head_dim, arch.q_heads // arch.kv_heads
    for chip, block in enumerate((chip0, chip1)):
        for local_q in range(arch.q_heads // 2):
            global_q = chip * arch.q_heads // 2 + local_q
            cols = slice(local_q * d, (local_q + 1) * d)
            assert np.array_equal(
                block["layers.0.wq"][:, cols], full["layers.0.wq"][:, global_q * d : (global_q + 1) * d]
            )
            global_kv = global_q // group
            local_kv = global_kv - chip * arch.kv_heads // 2
            assert 0 <= local_kv < arch.kv_heads // 2
            assert np.array_equal(
                block["layers.0.wk"][:, local_kv * d : (local_kv + 1) * d],
                full["layers.0.wk"][:, global_kv * d : (global_kv + 1) * d],
            )


def test_param_block_round_trips_under_its_bin_name(tmp_path: Path) -> None:
    chip0, _ = split_for_chips(generate_tiny_weights(TINY_ARCH, 3), TINY_ARCH)
    path = tmp_path / "param_blk0.bin"
    save_param_block(path, chip0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["param_blk0.bin"]  # no .npz appended
    loaded = load_param_block(path)
    assert loaded.keys() == chip0.keys()
    assert all(np.array_equal(loaded[n], chip0[n]) and loaded[n].dtype == chip0[n].dtype for n in chip0)


def test_a_pickled_object_array_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "param_blk0.bin"
    with open(path, "wb") as f:
        np.savez(f, evil=np.array([{"a": 1}], dtype=object))
    with pytest.raises(KernelConfigError, match=r"param_blk0.bin: not a readable parameter block"):
        load_param_block(path)


def test_a_bare_npy_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "param_blk0.bin"
    with open(path, "wb") as f:
        np.save(f, np.zeros(3, np.float32))
    with pytest.raises(KernelConfigError, match=r"param_blk0.bin: not an npz archive of named tensors"):
        load_param_block(path)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"q_heads": 3, "kv_heads": 1}, r"q_heads=3 must be even.*kv_heads=1 must be even"),
        ({"expert_intermediate": 31}, r"expert_intermediate=31 must be even"),
        ({"vocab_size": 511}, r"vocab_size=511 must be even"),
        ({"head_dim": 15}, r"head_dim=15 must be even"),
        ({"q_heads": 6, "kv_heads": 4}, r"q_heads=6 must be a multiple of kv_heads=4 \(GQA\)"),
        ({"experts_per_token": 9}, r"experts_per_token=9 must be in \[1, experts=8\]"),
        ({"layers": 0}, r"layers must be >= 1"),
    ],
)
def test_geometry_that_cannot_be_split_is_refused(change: dict[str, int], message: str) -> None:
    with pytest.raises(KernelConfigError, match=message):
        generate_tiny_weights(replace(TINY_ARCH, **change), 0)  # type: ignore[arg-type]


def test_split_refuses_weights_of_another_geometry() -> None:
    weights = generate_tiny_weights(TINY_ARCH, 0)
    with pytest.raises(KernelConfigError, match=r"full weights: embed has shape \(512, 64\), expected \(514, 64\)"):
        split_for_chips(weights, replace(TINY_ARCH, vocab_size=514))
