"""Golden outputs of a package: what its kernel produces for a fixed prompt, recorded at build time.

Owns the golden procedure, which the daemon's Warming step repeats and compares (docs/daemon.md):
build the package's kernel (`make_kernel`, 1 lane), prefill the prompt into lane 0,
round the logits to bf16 (the device returns bf16), record the top-`GOLDEN_TOP_K` (token,
logit) pairs, then greedy-decode `GOLDEN_DECODE_STEPS` steps, recording every greedy token.
Greedy = the lowest id among the largest bf16 logits. The golden depends only on the manifest's
geometry, kernel, seed, tokenizer EOS ids and the weight files, never on file hashes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path

import ml_dtypes
import numpy as np

from calculet.daemon.calsim.kernel import DecodeRow, Kernel, make_kernel
from calculet.daemon.package.manifest import GoldenDecl, PackageManifest

GOLDEN_MESSAGES: tuple[dict[str, str], ...] = ({"role": "user", "content": "Hello! How can I help you today?"},)
GOLDEN_TOP_K = 5
GOLDEN_DECODE_STEPS = 8
# Floor of the logit tolerance: float32 results may differ in the last bits between BLAS builds
# (reduction order); below |logit| ~ 2.5 a bf16 ulp is smaller than this, so the floor rules there.
MIN_LOGIT_ATOL = 1e-2
BF16_MANTISSA_BITS = 7

KernelFactory = Callable[[PackageManifest, Path, int, int], Kernel]


def bf16_round(logits: np.ndarray) -> np.ndarray:
    """float32 -> bf16 -> float32 (round to nearest even), what the device's bf16 output holds."""
    return np.asarray(logits, dtype=np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)


def bf16_ulp(value: float) -> float:
    """Spacing of bf16 numbers at `value` (one unit in the last place)."""
    mag = abs(value)
    if mag == 0.0 or not math.isfinite(mag):
        return 0.0
    return 2.0 ** (math.floor(math.log2(mag)) - BF16_MANTISSA_BITS)


def top_logits(logits: np.ndarray, k: int) -> tuple[tuple[int, float], ...]:
    """The `k` largest logits as (token, logit), descending, ties broken by lower token id.

    Selection uses `np.partition` (O(vocab)), then sorts only the candidates, so it is cheap at
    vocab 151,936.
    """
    k = min(k, logits.shape[0])
    kth = np.partition(logits, logits.shape[0] - k)[logits.shape[0] - k]
    candidates = np.flatnonzero(logits >= kth)
    order = np.lexsort((candidates, -logits[candidates]))[:k]
    return tuple((int(candidates[i]), float(logits[candidates[i]])) for i in order)


def logit_atol(top: Sequence[tuple[int, float]]) -> float:
    """Tolerance for comparing `top` logits on a re-run.

    A value that lands near a bf16 rounding boundary can round to the neighbouring bf16 number
    when float32 noise (summation order) moves it slightly, i.e. differ by one bf16 ulp; so the
    tolerance is one ulp at the largest magnitude, at least `MIN_LOGIT_ATOL`.
    """
    largest = max((abs(v) for _, v in top), default=0.0)
    return max(MIN_LOGIT_ATOL, bf16_ulp(largest))


def greedy(logits: np.ndarray) -> int:
    """Greedy token of bf16-rounded logits: the first (lowest id) maximum."""
    return int(np.argmax(logits))


def compute_golden(
    manifest: PackageManifest,
    package_dir: Path,
    prompt_tokens: Sequence[int],
    kernel_factory: KernelFactory = make_kernel,
) -> GoldenDecl:
    """Run the package's kernel on `prompt_tokens` and record the golden outputs.

    Args:
        manifest: the package's manifest (its `golden` field is ignored).
        package_dir: where the weight files are.
        prompt_tokens: the fixed prompt, at most the package's prefill bucket.
        kernel_factory: `make_kernel` or a test double with the same signature.

    Returns:
        The golden: prompt, top-K after prefill, 1 + GOLDEN_DECODE_STEPS greedy tokens, tolerance.

    Raises:
        ValueError: the kernel refuses the package or the prompt (see `Kernel`).
    """
    n = len(prompt_tokens)
    # One lane, just long enough: the golden is a function of the KV contents only.
    kernel = kernel_factory(manifest, package_dir, 1, n + GOLDEN_DECODE_STEPS)
    logits = bf16_round(kernel.prefill(0, 0, np.asarray(prompt_tokens, np.int32), np.arange(n, dtype=np.int32)))
    top = top_logits(logits, GOLDEN_TOP_K)
    tokens = [greedy(logits)]
    for step in range(GOLDEN_DECODE_STEPS):
        row = DecodeRow(lane=0, past_kv_len=n + step, token=tokens[-1], position=n + step)
        tokens.append(greedy(bf16_round(kernel.decode([row]))[0]))
    return GoldenDecl(
        prompt_tokens=tuple(int(t) for t in prompt_tokens),
        prefill_top=top,
        decode_tokens=tuple(tokens),
        logit_atol=logit_atol(top),
    )
