"""Small manifest, package and kernel factories for the calsim kernel tests.

Test modules import these helpers from here; `conftest.py` only exposes the fixtures to pytest.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from calculet.daemon.calsim.kernel import Kernel
from calculet.daemon.calsim.kernel import make_kernel as build_kernel
from calculet.daemon.calsim.kernels.numeric import NumericKernel
from calculet.daemon.calsim.kernels.synthetic import SyntheticKernel
from calculet.daemon.calsim.kernels.weights import generate_tiny_weights, save_param_block, split_for_chips
from calculet.daemon.package.manifest import (
    Architecture,
    ChipMemoryDecl,
    Compatibility,
    DecodePoint,
    GoldenDecl,
    KVDecl,
    MemoryDecl,
    PackageManifest,
    TimingDecl,
    TokenizerDecl,
    Topology,
)

TINY_ARCH = Architecture(
    family="qwen3_moe",
    layers=2,
    hidden_size=64,
    q_heads=4,
    kv_heads=2,
    head_dim=16,
    experts=8,
    experts_per_token=2,
    expert_intermediate=32,
    vocab_size=512,
    rope_theta=1e6,
    rms_norm_eps=1e-6,
)

REAL_ARCH = replace(
    TINY_ARCH, layers=48, hidden_size=2048, q_heads=32, kv_heads=4, head_dim=128, experts=128,
    experts_per_token=8, expert_intermediate=768, vocab_size=151_936,
)  # fmt: skip


def make_manifest(
    arch: Architecture = TINY_ARCH,
    *,
    kernel: str = "numeric",
    eos: tuple[int, ...] = (1, 2),
    seed: int = 7,
    lanes: int = 4,
    lane_context: int = 256,
    kv_dtype: str = "fp32",
) -> PackageManifest:
    """A structurally complete manifest; only the fields the kernels read matter."""
    kv_bytes = 2 if kv_dtype == "bf16" else 4
    return PackageManifest(
        schema_version=1,
        name="kernel-test",
        model_role="llm",
        kernel=kernel,
        architecture=arch,
        quantization="none",
        topology=Topology(chips=2, chip_masks=(1, 2), parallelism="tp"),
        kv=KVDecl(
            dtype=kv_dtype,
            layout="lane-layer-head-token-dim",
            lanes=lanes,
            lane_context=lane_context,
            bytes_per_token=arch.layers * arch.kv_heads * 2 * arch.head_dim * kv_bytes,
            split="kv_heads",
        ),
        submodels=(),
        memory=MemoryDecl(
            chips=(ChipMemoryDecl(0, 1, 0, 0, 0), ChipMemoryDecl(1, 2, 0, 0, 0)),
            device_memory_required_bytes=0,
        ),
        compatibility=Compatibility(runtime=">=0.7.6,<0.8", driver=">=0.7,<1"),
        files=(),
        tokenizer=TokenizerDecl(path="tokenizer", chat_template="", model_max_length=lane_context, eos_token_ids=eos),
        golden=GoldenDecl(prompt_tokens=(), prefill_top=(), decode_tokens=(), logit_atol=0.0),
        timing=TimingDecl(
            decode_curve=(DecodePoint(0, 17.2), DecodePoint(40960, 80.0)),
            prefill_fixed_ms=100.0,
            prefill_ms_per_token=1.5,
            batch_alpha=0.1,
            h2d_gbps=10.0,
            d2h_gbps=10.0,
        ),
        synthetic_seed=seed,
    )


def write_numeric_package(package_dir: Path, arch: Architecture = TINY_ARCH, seed: int = 11) -> dict[str, np.ndarray]:
    """Write param_blk0.bin / param_blk1.bin for `arch`; returns the full (unsplit) weights."""
    weights = generate_tiny_weights(arch, seed)
    chip0, chip1 = split_for_chips(weights, arch)
    save_param_block(package_dir / "param_blk0.bin", chip0)
    save_param_block(package_dir / "param_blk1.bin", chip1)
    return weights


@pytest.fixture(scope="module")
def tiny_package(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, np.ndarray]]:
    """One tiny numeric package per test module: (package_dir, full weights)."""
    package_dir = tmp_path_factory.mktemp("tiny")
    return package_dir, write_numeric_package(package_dir)


KernelMaker = Callable[..., Kernel]


@pytest.fixture(scope="module", params=["numeric", "synthetic"])
def kernel_maker(request: pytest.FixtureRequest, tiny_package: tuple[Path, dict[str, np.ndarray]]) -> KernelMaker:
    """Fresh kernels of one kind (each test runs for both) over the tiny geometry:
    `kernel_maker(lanes=4, lane_context=64)`."""
    package_dir, _ = tiny_package
    kind = request.param

    def make(lanes: int = 4, lane_context: int = 64) -> Kernel:
        manifest = make_manifest(kernel=kind, lanes=lanes, lane_context=lane_context)
        return build_kernel(manifest, package_dir, lanes, lane_context)

    return make


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal bit for bit: same dtype and shape, same raw bytes (so -0.0 != 0.0 and NaN == NaN)."""
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and bool(np.array_equal(a.view(np.uint8), b.view(np.uint8)))


def same_logits(kernel: Kernel, a: np.ndarray, b: np.ndarray) -> bool:
    """Equal as the `Kernel` contract promises: bit for bit, for both kernels (a row's logits
    depend on its lane's KV only, and prefill computes what decode steps compute)."""
    del kernel  # both kernels are exact; kept so call sites name the kernel they compare
    return same_bits(a, b)


def lane_kv(kernel: Kernel, lane: int, slots: int) -> list[np.ndarray]:
    """Copies of what `kernel` stores for slots 0..slots-1 of `lane` (every chip's K and V for the
    numeric kernel, the hash chain for the synthetic one)."""
    if isinstance(kernel, NumericKernel):
        return [c[lane, :, :, :slots].copy() for chip in kernel.chips for c in (chip.k_cache, chip.v_cache)]
    if isinstance(kernel, SyntheticKernel):
        return [kernel._chain[lane, :slots].copy()]
    raise TypeError(f"no KV view for {type(kernel).__name__}")


def clearly_different(a: np.ndarray, b: np.ndarray) -> bool:
    """Different by far more than any fp32 rounding."""
    return bool(np.max(np.abs(a - b)) > 1e-2)


def arange32(start: int, stop: int) -> np.ndarray:
    return np.arange(start, stop, dtype=np.int32)
