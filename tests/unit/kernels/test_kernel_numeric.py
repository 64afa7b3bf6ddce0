"""The numeric kernel's 2-chip tensor-parallel forward against the single-chip reference."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from calculet.common.errors import ErrorKind
from calculet.daemon.calsim.kernel import DecodeRow
from calculet.daemon.calsim.kernels.errors import KernelConfigError
from calculet.daemon.calsim.kernels.numeric import NumericKernel
from calculet.daemon.calsim.kernels.reference import reference_forward
from calculet.daemon.calsim.kernels.weights import load_param_block, save_param_block
from calculet.daemon.package.manifest import Topology

from .kernel_factories import TINY_ARCH, arange32, make_manifest, write_numeric_package

TOL = {"rtol": 1e-4, "atol": 1e-4}
SETTINGS = settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
Package = tuple[Path, dict[str, np.ndarray]]


def kernel(package_dir: Path, kv_dtype: str = "fp32", lanes: int = 4, ctx: int = 64) -> NumericKernel:
    return NumericKernel(make_manifest(kv_dtype=kv_dtype), package_dir, lanes, ctx)


@SETTINGS
@given(tokens=st.lists(st.integers(0, TINY_ARCH.vocab_size - 1), min_size=1, max_size=40))
def test_prefill_matches_the_single_chip_reference(tiny_package: Package, tokens: list[int]) -> None:
    package_dir, weights = tiny_package
    got = kernel(package_dir).prefill(1, 0, np.asarray(tokens, np.int32), arange32(0, len(tokens)))
    want = reference_forward(weights, TINY_ARCH, np.asarray(tokens))[-1]
    np.testing.assert_allclose(got, want, **TOL)


@pytest.mark.parametrize("kv_dtype", ["fp32", "bf16"])
def test_prefill_then_decode_through_the_kv_cache_matches_the_reference(tiny_package: Package, kv_dtype: str) -> None:
    package_dir, weights = tiny_package
    tokens = np.random.default_rng(1).integers(0, TINY_ARCH.vocab_size, 30)
    want = reference_forward(weights, TINY_ARCH, tokens, kv_dtype=kv_dtype)
    k = kernel(package_dir, kv_dtype)
    got = [k.prefill(2, 0, tokens[:22].astype(np.int32), arange32(0, 22))]
    got += [k.decode([DecodeRow(2, p, int(tokens[p]), p)])[0] for p in range(22, 30)]
    np.testing.assert_allclose(np.stack(got), want[21:], **TOL)


def test_bf16_kv_is_rounded_like_a_bf16_cache(tiny_package: Package) -> None:
    """The KV dtype is really used: bf16 storage differs from fp32 storage, and each matches its reference."""
    package_dir, weights = tiny_package
    tokens = np.arange(3, 40, dtype=np.int32)
    fp32 = kernel(package_dir, "fp32").prefill(0, 0, tokens, arange32(0, len(tokens)))
    bf16 = kernel(package_dir, "bf16").prefill(0, 0, tokens, arange32(0, len(tokens)))
    assert not np.allclose(fp32, bf16, **TOL)
    np.testing.assert_allclose(bf16, reference_forward(weights, TINY_ARCH, tokens, kv_dtype="bf16")[-1], **TOL)


def test_rope_positions_are_passed_through(tiny_package: Package) -> None:
    package_dir, weights = tiny_package
    tokens = np.array([7, 70, 170, 270], np.int32)
    positions = np.array([0, 3, 9, 30], np.int32)
    k = kernel(package_dir)
    k.prefill(0, 0, tokens[:2], positions[:2])
    k.decode([DecodeRow(0, 2, 170, 9)])
    got = k.decode([DecodeRow(0, 3, 270, 30)])[0]
    np.testing.assert_allclose(got, reference_forward(weights, TINY_ARCH, tokens, positions)[-1], **TOL)


def test_batched_decode_matches_the_reference_per_sequence(tiny_package: Package) -> None:
    package_dir, weights = tiny_package
    rng = np.random.default_rng(2)
    seqs = {lane: rng.integers(0, TINY_ARCH.vocab_size, n) for lane, n in ((0, 6), (1, 13), (3, 2))}
    k = kernel(package_dir)
    for lane, seq in seqs.items():
        k.prefill(lane, 0, seq[:-1].astype(np.int32), arange32(0, len(seq) - 1))
    out = k.decode([DecodeRow(lane, len(s) - 1, int(s[-1]), len(s) - 1) for lane, s in seqs.items()])
    for i, seq in enumerate(seqs.values()):
        np.testing.assert_allclose(out[i], reference_forward(weights, TINY_ARCH, seq)[-1], **TOL)


def test_tiny_logits_are_not_degenerate(tiny_package: Package) -> None:
    package_dir, _ = tiny_package
    logits = kernel(package_dir).prefill(0, 0, np.array([1, 2, 3], np.int32), arange32(0, 3))
    top = np.sort(logits)[::-1]
    assert np.isfinite(logits).all()
    assert logits.std() > 0.5  # spread enough that sampling and greedy are meaningful
    assert top[0] > top[1]


def test_kv_bytes_match_the_manifest_figure(tiny_package: Package) -> None:
    package_dir, _ = tiny_package
    for kv_dtype in ("fp32", "bf16"):
        manifest = make_manifest(kv_dtype=kv_dtype)
        k = NumericKernel(manifest, package_dir, 3, 50)
        assert k.kv_bytes == manifest.kv.bytes_per_token * 3 * 50


# ------------------------------------------------------------------ bad packages


def _write(package_dir: Path, chip: int, block: dict[str, np.ndarray]) -> None:
    save_param_block(package_dir / f"param_blk{chip}.bin", block)


def _config_error(package_dir: Path, match: str, **manifest_changes: object) -> None:
    manifest = make_manifest()
    if manifest_changes:
        manifest = replace(manifest, **manifest_changes)  # type: ignore[arg-type]
    with pytest.raises(KernelConfigError, match=match) as exc:
        NumericKernel(manifest, package_dir, 2, 16)
    assert isinstance(exc.value, ValueError)  # make_kernel's contract
    assert exc.value.kind is ErrorKind.FAILED_PRECONDITION


@pytest.fixture
def package_copy(tmp_path: Path) -> Path:
    write_numeric_package(tmp_path)
    return tmp_path


def test_missing_param_block_is_refused(package_copy: Path) -> None:
    (package_copy / "param_blk1.bin").unlink()
    _config_error(package_copy, r"param_blk1.bin: parameter block not found")


def test_param_block_that_is_not_an_archive_is_refused(package_copy: Path) -> None:
    (package_copy / "param_blk0.bin").write_bytes(b"not a zip at all")
    _config_error(package_copy, r"param_blk0.bin: not a readable parameter block")


def test_wrong_shape_missing_and_extra_tensors_are_all_named(package_copy: Path) -> None:
    block = load_param_block(package_copy / "param_blk1.bin")
    block["layers.0.wq"] = block["layers.0.wq"][:, :-1]
    del block["lm_head"]
    block["stray"] = np.zeros(3, np.float32)
    _write(package_copy, 1, block)
    _config_error(
        package_copy,
        r"chip 1, mask 2\): missing lm_head; unexpected stray; "
        r"layers.0.wq has shape \(64, 31\), expected \(64, 32\)",
    )


def test_embedding_on_chip1_is_refused(package_copy: Path) -> None:
    block = load_param_block(package_copy / "param_blk1.bin")
    block["embed"] = load_param_block(package_copy / "param_blk0.bin")["embed"]
    _write(package_copy, 1, block)
    _config_error(package_copy, r"chip 1, mask 2\): unexpected embed")


def test_non_float32_tensor_is_refused(package_copy: Path) -> None:
    block = load_param_block(package_copy / "param_blk0.bin")
    block["final_norm"] = block["final_norm"].astype(np.float64)
    _write(package_copy, 0, block)
    _config_error(package_copy, r"final_norm has dtype float64, expected float32")


def test_replicated_tensors_must_agree_between_chips(package_copy: Path) -> None:
    block = load_param_block(package_copy / "param_blk1.bin")
    block["layers.1.router"] = block["layers.1.router"] + 1
    _write(package_copy, 1, block)
    _config_error(package_copy, r"replicated tensors differ between param_blk0.bin and param_blk1.bin: layers.1.router")


def test_geometry_that_cannot_be_split_is_refused(package_copy: Path) -> None:
    arch = replace(TINY_ARCH, q_heads=3, kv_heads=3)
    _config_error(package_copy, r"q_heads=3 must be even.*kv_heads=3 must be even", architecture=arch)


def test_topology_must_be_two_chips(package_copy: Path) -> None:
    _config_error(
        package_copy,
        r"runs on 2 chips, manifest topology has 1",
        topology=Topology(chips=1, chip_masks=(1,), parallelism="none"),
    )


def test_unsupported_kv_dtype_is_refused(package_copy: Path) -> None:
    kv = replace(make_manifest().kv, dtype="int8")
    _config_error(package_copy, r"kv.dtype 'int8' unsupported", kv=kv)


def test_weights_for_another_geometry_are_refused(package_copy: Path) -> None:
    arch = replace(TINY_ARCH, vocab_size=600)
    _config_error(package_copy, r"embed has shape \(512, 64\), expected \(600, 64\)", architecture=arch)
