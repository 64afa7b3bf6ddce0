"""Weights of the numeric kernel: names, generation, 2-chip tensor-parallel split, param block files.

Data flow: `generate_tiny_weights` -> full weights -> `split_for_chips` -> (chip0, chip1) ->
`save_param_block` writes `param_blk0.bin` (chip mask 1) and `param_blk1.bin` (chip mask 2) into a
package -> the numeric kernel loads each with `load_param_block` and checks it with `check_block`.

Full tensor names and shapes (float32; projections are `x @ W`, i.e. [in, out]; heads are
contiguous column groups of `head_dim`; H = hidden_size, D = head_dim, E = experts,
I = expert_intermediate, V = vocab_size):

    embed                 [V, H]          token embedding (rows = token ids)
    layers.{l}.attn_norm  [H]             RMSNorm before attention
    layers.{l}.wq         [H, q_heads*D]
    layers.{l}.wk         [H, kv_heads*D]
    layers.{l}.wv         [H, kv_heads*D]
    layers.{l}.q_norm     [D]             per-head RMSNorm of q (Qwen3 q-norm)
    layers.{l}.k_norm     [D]             per-head RMSNorm of k (Qwen3 k-norm)
    layers.{l}.wo         [q_heads*D, H]
    layers.{l}.ffn_norm   [H]             RMSNorm before the MoE
    layers.{l}.router     [H, E]
    layers.{l}.w_gate     [E, H, I]       SiLU-GLU experts: (silu(x@gate) * (x@up)) @ down
    layers.{l}.w_up       [E, H, I]
    layers.{l}.w_down     [E, I, H]
    final_norm            [H]
    lm_head               [V, H]          logits = x @ lm_head.T

Tensor-parallel split over 2 chips (docs/sources.md 001 §6): chip c holds q heads and kv heads
[c*n/2, (c+1)*n/2) (so GQA groups stay on one chip and each chip owns its KV heads), the same
half of every expert's intermediate dimension (all experts on both chips), vocab rows
[c*V/2, (c+1)*V/2) of lm_head; norms and router are replicated; `embed` is on chip 0 only.
Chip blocks use the same names with the split shapes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import cast
from zipfile import BadZipFile

import numpy as np

from calculet.daemon.calsim.kernels.errors import KernelConfigError
from calculet.daemon.package.manifest import Architecture

CHIPS = 2
# Per-layer tensors split along this axis (the halves described in the module docstring).
_SPLIT_AXIS: dict[str, int] = {"wq": 1, "wk": 1, "wv": 1, "wo": 0, "w_gate": 2, "w_up": 2, "w_down": 1}
_LM_HEAD_AXIS = 0


def param_block_name(chip: int) -> str:
    """File name of chip `chip`'s parameter block inside a package."""
    return f"param_blk{chip}.bin"


def check_geometry(arch: Architecture) -> None:
    """Raises KernelConfigError unless `arch` can be split over 2 chips as the numeric kernel does."""
    problems = []
    if arch.dense:
        raise KernelConfigError("numeric kernel: mixture-of-experts only; a dense model (experts 0) runs on synthetic")
    for name in ("layers", "hidden_size", "q_heads", "kv_heads", "head_dim", "experts", "vocab_size"):
        if getattr(arch, name) < 1:
            problems.append(f"{name} must be >= 1")
    for name in ("q_heads", "kv_heads", "expert_intermediate", "vocab_size", "head_dim"):
        if getattr(arch, name) % CHIPS:
            problems.append(f"{name}={getattr(arch, name)} must be even (2-chip split, RoPE pairs)")
    if arch.kv_heads > 0 and arch.q_heads % arch.kv_heads:
        problems.append(f"q_heads={arch.q_heads} must be a multiple of kv_heads={arch.kv_heads} (GQA)")
    if not 1 <= arch.experts_per_token <= arch.experts:
        problems.append(f"experts_per_token={arch.experts_per_token} must be in [1, experts={arch.experts}]")
    if problems:
        raise KernelConfigError("numeric kernel geometry: " + "; ".join(problems))


def full_shapes(arch: Architecture) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every full (unsplit) tensor."""
    h, d, e, i, v = arch.hidden_size, arch.head_dim, arch.experts, arch.expert_intermediate, arch.vocab_size
    shapes: dict[str, tuple[int, ...]] = {"embed": (v, h)}
    for layer in range(arch.layers):
        p = f"layers.{layer}."
        shapes.update({
            p + "attn_norm": (h,), p + "wq": (h, arch.q_heads * d), p + "wk": (h, arch.kv_heads * d),
            p + "wv": (h, arch.kv_heads * d), p + "q_norm": (d,), p + "k_norm": (d,),
            p + "wo": (arch.q_heads * d, h), p + "ffn_norm": (h,), p + "router": (h, e),
            p + "w_gate": (e, h, i), p + "w_up": (e, h, i), p + "w_down": (e, i, h),
        })  # fmt: skip
    shapes["final_norm"] = (h,)
    shapes["lm_head"] = (v, h)
    return shapes


def _split_axis(name: str) -> int | None:
    if name == "lm_head":
        return _LM_HEAD_AXIS
    return _SPLIT_AXIS.get(name.rsplit(".", 1)[-1])


def chip_shapes(arch: Architecture, chip: int) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor in chip `chip`'s parameter block."""
    shapes = {}
    for name, shape in full_shapes(arch).items():
        if name == "embed" and chip != 0:
            continue
        axis = _split_axis(name)
        if axis is not None:
            shape = (*shape[:axis], shape[axis] // CHIPS, *shape[axis + 1 :])
        shapes[name] = shape
    return shapes


def replicated_names(arch: Architecture) -> list[str]:
    """Tensors both chips hold in full (norms, q/k-norms, routers); `embed` is on chip 0 only."""
    return [n for n in full_shapes(arch) if n != "embed" and _split_axis(n) is None]


def generate_tiny_weights(arch: Architecture, seed: int) -> dict[str, np.ndarray]:
    """Random full weights with init scales that keep activations O(1) and logits spread out.

    Projections are N(0, 1/fan_in) so each keeps the RMS of its input; norms are 1 + N(0, 0.1^2)
    so they are not all identity; router logits and final logits are scaled up (x2, x3) so the
    top-k experts and the top tokens are well separated rather than near ties.

    Raises:
        KernelConfigError: the geometry cannot be split over 2 chips.
    """
    check_geometry(arch)
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for name, shape in full_shapes(arch).items():
        leaf = name.rsplit(".", 1)[-1]
        if leaf.endswith("norm"):
            w = 1.0 + 0.1 * rng.standard_normal(shape)
        elif leaf == "embed":
            w = rng.standard_normal(shape)
        else:
            fan_in = shape[-1] if leaf == "lm_head" else shape[-2]
            gain = {"router": 2.0, "lm_head": 3.0}.get(leaf, 1.0)
            w = rng.standard_normal(shape) * (gain / np.sqrt(fan_in))
        out[name] = w.astype(np.float32)
    return out


def check_block(tensors: Mapping[str, np.ndarray], expected: Mapping[str, tuple[int, ...]], where: str) -> None:
    """Raises KernelConfigError naming every missing, extra, misshapen or non-float32 tensor."""
    problems = [f"missing {n}" for n in expected if n not in tensors]
    problems += [f"unexpected {n}" for n in tensors if n not in expected]
    for name, shape in expected.items():
        t = tensors.get(name)
        if t is None:
            continue
        if t.shape != shape:
            problems.append(f"{name} has shape {t.shape}, expected {shape}")
        if t.dtype != np.float32:
            problems.append(f"{name} has dtype {t.dtype}, expected float32")
    if problems:
        raise KernelConfigError(f"{where}: " + "; ".join(problems))


def split_for_chips(
    weights: Mapping[str, np.ndarray], arch: Architecture
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Split full weights into the two chips' tensor-parallel blocks (copies, C-contiguous).

    Raises:
        KernelConfigError: the geometry cannot be split, or `weights` do not match `arch`.
    """
    check_geometry(arch)
    check_block(weights, full_shapes(arch), "full weights")
    blocks: list[dict[str, np.ndarray]] = [{}, {}]
    for chip in range(CHIPS):
        for name in chip_shapes(arch, chip):
            w = weights[name]
            axis = _split_axis(name)
            if axis is not None:
                half = w.shape[axis] // CHIPS
                w = np.take(w, np.arange(chip * half, (chip + 1) * half), axis=axis)
            blocks[chip][name] = np.ascontiguousarray(w)
    return blocks[0], blocks[1]


def save_param_block(path: Path, tensors: Mapping[str, np.ndarray]) -> None:
    """Write `tensors` to `path` (np.savez through a file object, so the name stays `param_blk{N}.bin`)."""
    savez = cast(Callable[..., None], np.savez)  # numpy's stub types **kwds as clashing with allow_pickle
    with open(path, "wb") as f:
        savez(f, allow_pickle=False, **tensors)


def load_param_block(path: Path) -> dict[str, np.ndarray]:
    """Read a parameter block written by `save_param_block` (no pickles).

    Raises:
        KernelConfigError: the file is missing, unreadable, or not an npz archive of plain arrays.
    """
    try:
        loaded = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise KernelConfigError(f"{path}: parameter block not found") from None
    except (OSError, ValueError, BadZipFile) as exc:
        raise KernelConfigError(f"{path}: not a readable parameter block ({exc})") from None
    if not isinstance(loaded, np.lib.npyio.NpzFile):
        raise KernelConfigError(f"{path}: not an npz archive of named tensors (a bare .npy array)")
    with loaded as archive:
        try:
            return {name: archive[name] for name in archive.files}
        except (OSError, ValueError, BadZipFile) as exc:
            # Object arrays need pickle (refused) and truncated members fail only when read.
            raise KernelConfigError(f"{path}: not a readable parameter block ({exc})") from None
