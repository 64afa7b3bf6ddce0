"""calsim timing figures for the simulated packages, each with its source.

Owns the numbers behind `TimingDecl` (both presets use the same ones: the tiny model stands in
for the real board, so it runs at the real board's pace). Every figure is derived here from a
measured value in docs/sources.md 001 §10 or from a stated ASSUMPTION, and the derivation is
written into `TimingDecl.sources`, which the manifest carries.

The decode curve: docs/sources.md 001 §10 measures 58.25 tok/s on a short context and tabulates
decode speed by context as ranges (Chinese; "上下文示例" = context, "Decode TPS" = tok/s):

    short 58-64 | ~2K 38-46 | ~4K 28-40 | ~8K-16K mostly 20-30 | ~33K about 12 | ~40K 10-16

One point per row, each inside its range, slowing monotonically (`SEED_DECODE_POINTS`); calsim
interpolates linearly between them and holds the first point's speed below it, which keeps every
context inside its row's range too (0-512: 58.25 tok/s, 8K: 28.8, 16K: 20.7). "K" is read as
1,024 tokens (2K = 2,048, ..., 40K = 40,960, the calbin context), ms = 1000 / tok/s rounded to
0.001 ms.
"""

from __future__ import annotations

from dataclasses import dataclass

from calculet.daemon.package.manifest import DecodePoint, TimingDecl

# docs/sources.md 001 §10, first-round measurement of the llama.cpp integration on today's calbin (batch 1,
# short context).
MEASURED_DECODE_TOK_PER_S = 58.25  # 246-token decode
MEASURED_PREFILL_TOK_PER_S = 184.27
MEASURED_PREFILL_TOKENS = 27
LONG_CONTEXT = 40_960  # calbin context (docs/sources.md 001 §5)
# ASSUMPTION: the table's "short context" row holds up to 512 tokens. The measured 58.25 tok/s ran
# over KV lengths 28-273 (27-token prompt + 246 tokens), so the curve is flat up to here: the
# measurement is reproduced exactly, and so is the measured 27-token prefill (no attention term).
SHORT_CONTEXT = 512
BATCH_ALPHA = 0.1
PCIE_GBPS = 8.0


@dataclass(frozen=True)
class SeedRow:
    """One row of docs/sources.md 001 §10's decode table, and the point we take from it.

    Attributes:
        label: the row as docs/sources.md 001 §10 writes it.
        low / high: its tok/s range (a point figure: its stated uncertainty).
        context: the context we place the point at.
        tok_per_s: the figure we take, inside [low, high].
        why: how the figure was chosen.
    """

    label: str
    low: float
    high: float
    context: int
    tok_per_s: float
    why: str


SEED_DECODE_POINTS: tuple[SeedRow, ...] = (
    SeedRow("short context, 2026-06/08", 58.0, 64.0, SHORT_CONTEXT, MEASURED_DECODE_TOK_PER_S,
            "the same section's measured 246-token decode after a 27-token prompt, KV 28-273;"
            f" ASSUMPTION: 'short' is up to {SHORT_CONTEXT} tokens, flat below"),
    SeedRow("~2K", 38.0, 46.0, 2_048, 42.0, "the row's midpoint"),
    SeedRow("~4K", 28.0, 40.0, 4_096, 34.0, "the row's midpoint"),
    SeedRow("~8K-16K", 20.0, 30.0, 12_288, 25.0, "the row's midpoint, at the middle of 8K-16K"),
    SeedRow("~33K", 11.0, 13.0, 33_792, 12.0, "the row's 'about 12', read as 11-13"),
    SeedRow("~40K", 10.0, 16.0, LONG_CONTEXT, 11.0,
            "near the low end: the curve must not speed up after 12 tok/s at 33K"),
)  # fmt: skip


def decode_curve() -> tuple[DecodePoint, ...]:
    """`SEED_DECODE_POINTS` as (context, ms per token) points."""
    return tuple(DecodePoint(r.context, round(1000.0 / r.tok_per_s, 3)) for r in SEED_DECODE_POINTS)


def _point_source(row: SeedRow, point: DecodePoint) -> str:
    return (
        f"docs/sources.md 001 §10 table, row '{row.label}': {row.low:g}-{row.high:g} tok/s; taken {row.tok_per_s:g} "
        f"tok/s at {row.context:,} tokens ({row.why}) => 1000/{row.tok_per_s:g} = {point.ms_per_token} ms/token"
    )


def sim_timing() -> TimingDecl:
    """The timing declaration written into every calsim package."""
    curve = decode_curve()
    decode_short = curve[0].ms_per_token
    prefill_total = 1000.0 * MEASURED_PREFILL_TOKENS / MEASURED_PREFILL_TOK_PER_S
    # One prefill pass reads all weights once, like a decode step; the rest scales with tokens.
    per_token = round((prefill_total - decode_short) / MEASURED_PREFILL_TOKENS, 3)
    sources = {
        "decode_curve": (
            "docs/sources.md 001 §10 decode table, one point per row (decode_curve[i] below); linear "
            "interpolation between the points is an ASSUMPTION (it stays inside every row's range); "
            "'K' read as 1,024 tokens; the last point is the calbin context 40,960 (docs/sources.md 001 §5)"
        ),
        **{
            f"decode_curve[{i}]": _point_source(r, p)
            for i, (r, p) in enumerate(zip(SEED_DECODE_POINTS, curve, strict=True))
        },
        "prefill_fixed_ms": (
            f"ASSUMPTION: a prefill pass costs one decode step ({decode_short} ms, one pass over the "
            "weights) plus a per-token part"
        ),
        "prefill_ms_per_token": (
            f"docs/sources.md 001 §10: {MEASURED_PREFILL_TOKENS}-token prefill at "
            f"{MEASURED_PREFILL_TOK_PER_S} tok/s => {prefill_total:.1f} ms; "
            f"({prefill_total:.1f} - {decode_short}) / {MEASURED_PREFILL_TOKENS} = {per_token} ms/token "
            "(the attention reads on top come from decode_curve)"
        ),
        "batch_alpha": (
            f"ASSUMPTION: batch-B decode costs t1 * (1 + {BATCH_ALPHA} * (B - 1)); MoE expert reads grow "
            "sublinearly with batch; vendor batch 4/8/16 calbins do not exist yet (docs/sources.md 001 §11)"
        ),
        "h2d_gbps": f"ASSUMPTION: PCIe Gen4 x8 effective, {PCIE_GBPS} GB/s host to device",
        "d2h_gbps": f"ASSUMPTION: PCIe Gen4 x8 effective, {PCIE_GBPS} GB/s device to host",
    }
    return TimingDecl(
        decode_curve=curve,
        prefill_fixed_ms=decode_short,
        prefill_ms_per_token=per_token,
        batch_alpha=BATCH_ALPHA,
        h2d_gbps=PCIE_GBPS,
        d2h_gbps=PCIE_GBPS,
        sources=sources,
    )
