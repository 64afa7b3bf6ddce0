"""`--plot OUT.png` of a multi-turn run: three panels drawn with matplotlib (optional, as in `plot.py`).

Left: TTFT p50 / p90 / p99 by turn number (ms, log scale), with the modelled uncached TTFT when the
report has a timing model. Middle: the share of prompt tokens served from cache by turn, beside the
share the previous turn carried (the most per-lane reuse can serve). Right: output tokens per second
over the measured window and the requests in flight (`plot.throughput_series`). Everything from the
report's JSON and the records; `require_matplotlib` refuses the run before it starts when missing.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from calculet.ops.bench.plot import QUANTILES, require_matplotlib, throughput_series
from calculet.ops.bench.records import RequestRecord


def write_turn_plot(path: Path, report: dict[str, Any], records: Sequence[RequestRecord], start: float) -> None:
    """Draw the three panels into `path` (PNG).

    Raises:
        FailedPrecondition: matplotlib is missing.
        OSError: the file cannot be written.
    """
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["multiturn"]["per_turn"]
    turns = [row["turn"] for row in rows]
    fig, (left, middle, right) = plt.subplots(1, 3, figsize=(16, 4.8))
    for q in QUANTILES:
        left.plot(turns, [row["ttft_ms"][q] or float("nan") for row in rows], marker="o", label=f"TTFT {q}")
    modelled = [row["modelled_uncached_ttft_ms"] for row in rows]
    if any(m is not None for m in modelled):
        left.plot(turns, [m if m is not None else float("nan") for m in modelled], "k--", label="modelled uncached")
    left.set_yscale("log")
    left.set_xticks(turns)
    left.set_xlabel("turn")
    left.set_ylabel("ms")
    left.set_title("TTFT by turn")
    left.legend()
    width = 0.4
    cached = [100 * (row["cached_share"] or 0.0) for row in rows]
    carried = [100 * (row["carried_share"] or 0.0) for row in rows]
    middle.bar([t - width / 2 for t in turns], cached, width=width, label="served from cache")
    middle.bar([t + width / 2 for t in turns], carried, width=width, label="carried by the previous turn")
    middle.set_xticks(turns)
    middle.set_ylim(0, 100)
    middle.set_xlabel("turn")
    middle.set_ylabel("% of prompt tokens")
    middle.set_title("prompt tokens from cache")
    middle.legend(loc="lower right")
    centres, rate, in_flight = throughput_series(records, start, report["duration_s"])
    right.plot(centres, rate, color="tab:blue")
    right.set_xlabel("s since the window start")
    right.set_ylabel("output tokens/s", color="tab:blue")
    right.set_ylim(bottom=0)
    twin = right.twinx()
    twin.step(centres, in_flight, where="mid", color="tab:orange")
    twin.set_ylabel("requests in flight", color="tab:orange")
    twin.set_ylim(bottom=0)
    right.set_title(f"throughput ({report['throughput']['output_tokens_per_s'] or 0:.1f} tokens/s overall)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
