"""calsim timing of a dense single-chip model, derived from the measured Qwen3-30B-A3B figures.

Owns the `TimingDecl` of the `qwen3-4b` preset. Nothing was measured for it: every figure comes
from the A3B table (`timing.sim_timing`, docs/sources.md 001 §10) through a stated ASSUMPTION, and
the derivation is written into `TimingDecl.sources` like the A3B's own.

- Weight reads. A decode step is bound by memory bandwidth: its time at short context is the
  weight bytes one chip reads per token over that chip's effective bandwidth. A3B reads
  `param_count(A3B).read_per_token` weights per token (attention, router, 8 of 128 experts, the
  output head) at its average stored width (params bytes of both chips / weights stored), split
  over 2 chips; its measured 17.167 ms gives the effective bandwidth of one chip. The dense model
  reads every weight, BF16, on one chip, at the same bandwidth.
- Attention reads. The growth of the A3B curve with context is its KV reads; the dense model
  reads `its KV bytes per token / A3B's per chip` times as much at the same context.
- Prefill. The per-token part is compute: it scales with weights multiplied per token per chip.
- Batch cost, copies: as for A3B.
"""

from __future__ import annotations

from calculet.daemon.package.manifest import DecodePoint, TimingDecl
from calculet.daemon.package.param_count import param_count
from calculet.daemon.package.presets import QWEN3_30B_A3B, ModelPreset
from calculet.ops.sim_packages.timing import sim_timing

DENSE_BYTES_PER_WEIGHT = 2  # BF16


def a3b_bytes_per_weight() -> float:
    """A3B's average stored width: both chips' params (DRAM + SRAM) over its weights stored."""
    stored_bytes = sum(QWEN3_30B_A3B.param_file_bytes)
    return stored_bytes / param_count(QWEN3_30B_A3B.architecture).stored


def dense_timing(model: ModelPreset) -> TimingDecl:
    """The timing of `model` (dense, BF16, `model.topology.chips` chips) derived from A3B's.

    Raises:
        ValueError: `model` is not dense.
    """
    if not model.architecture.dense:
        raise ValueError(f"{model.name} is not a dense model")
    base = sim_timing()
    a3b, a3b_chips = param_count(QWEN3_30B_A3B.architecture), QWEN3_30B_A3B.topology.chips
    ours, chips = param_count(model.architecture), model.topology.chips
    width = a3b_bytes_per_weight()
    a3b_chip_read = a3b.read_per_token * width / a3b_chips
    chip_read = ours.read_per_token * DENSE_BYTES_PER_WEIGHT / chips
    short = base.decode_curve[0].ms_per_token
    gb_per_s = a3b_chip_read / short / 1e6  # bytes per ms / 1e6 = GB/s
    weights_ms = round(chip_read / a3b_chip_read * short, 3)
    kv_ratio = (model.kv_bytes_per_token / chips) / (QWEN3_30B_A3B.kv_bytes_per_token / a3b_chips)
    curve = tuple(
        DecodePoint(p.context, round(weights_ms + (p.ms_per_token - short) * kv_ratio, 3)) for p in base.decode_curve
    )
    compute_ratio = (ours.read_per_token / chips) / (a3b.read_per_token / a3b_chips)
    per_token = round(base.prefill_ms_per_token * compute_ratio, 3)
    sources = {
        "decode_curve": (
            "derived from the A3B curve (docs/sources.md 001 §10): weights part + A3B's attention growth"
            f" x {kv_ratio:g} (decode_curve[0] and kv_ratio below)"
        ),
        "decode_curve[0]": (
            f"ASSUMPTION: decode is bound by weight reads at one chip's effective bandwidth. A3B reads "
            f"{a3b.read_per_token:,} weights per token (param_count: attention, router, 8 of 128 experts, head) "
            f"x {width:.4f} B (its params bytes / {a3b.stored:,} weights) / {a3b_chips} chips = "
            f"{a3b_chip_read / 1e9:.3f} GB per chip in {short} ms => {gb_per_s:.1f} GB/s per chip; "
            f"{model.name} reads all {ours.read_per_token:,} weights x {DENSE_BYTES_PER_WEIGHT} B (BF16) on "
            f"{chips} chip = {chip_read / 1e9:.3f} GB => {weights_ms} ms per token"
        ),
        "kv_ratio": (
            f"ASSUMPTION: attention reads scale with KV bytes per token per chip: {model.kv_bytes_per_token:,} B "
            f"on {chips} chip vs A3B's {QWEN3_30B_A3B.kv_bytes_per_token:,} B over {a3b_chips} => x {kv_ratio:g}"
        ),
        "prefill_fixed_ms": "ASSUMPTION (as A3B): a prefill pass costs one decode step, one pass over the weights",
        "prefill_ms_per_token": (
            f"ASSUMPTION: compute-bound, scales with weights multiplied per token per chip: A3B "
            f"{base.prefill_ms_per_token} ms x ({ours.read_per_token:,} / {chips}) / "
            f"({a3b.read_per_token:,} / {a3b_chips}) = {per_token} ms; and BF16 matrix throughput equal to "
            "A3B's W8A8 (optimistic if the NPU runs int8 faster)"
        ),
        "batch_alpha": f"ASSUMPTION: as A3B ({base.batch_alpha}); a dense batch shares every weight read",
        "h2d_gbps": base.sources["h2d_gbps"],
        "d2h_gbps": base.sources["d2h_gbps"],
    }
    return TimingDecl(
        decode_curve=curve,
        prefill_fixed_ms=weights_ms,
        prefill_ms_per_token=per_token,
        batch_alpha=base.batch_alpha,
        h2d_gbps=base.h2d_gbps,
        d2h_gbps=base.d2h_gbps,
        sources=sources,
    )
