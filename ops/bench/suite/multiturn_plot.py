"""The multi-turn comparison's plot (`plots/multiturn.png`), drawn from the suite document.

Left: TTFT p50 by turn, one line per run (ms, log scale). Middle: the share of prompt tokens served
from cache by turn, one line per run. Right: output tokens per device second (wall x time scale,
`multiturn_targets.device_rate`) of each run, as bars. Runs without a report are left out.
matplotlib is optional (`calculet[bench]`) and imported only here.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from calculet.ops.bench.plot import require_matplotlib
from calculet.ops.bench.suite.multiturn_targets import device_rate

NAME = "multiturn.png"


def write_multiturn_plot(out_dir: Path, records: Sequence[dict[str, Any]]) -> list[Path]:
    """Draw the plot into `out_dir` when a run has a report.

    Returns:
        The file written (none when no run measured anything).

    Raises:
        FailedPrecondition: matplotlib is missing.
        OSError: the file cannot be written.
    """
    measured = [r for r in records if (r.get("report") or {}).get("multiturn")]
    if not measured:
        return []
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, middle, right) = plt.subplots(1, 3, figsize=(17, 5))
    for r in measured:
        rows = r["report"]["multiturn"]["per_turn"]
        turns = [row["turn"] for row in rows]
        left.plot(turns, [row["ttft_ms"]["p50"] or float("nan") for row in rows], marker="o", label=r["config"])
        shares = [100 * row["cached_share"] if row["cached_share"] is not None else float("nan") for row in rows]
        middle.plot(turns, shares, marker="o", label=r["config"])
    turns = sorted({row["turn"] for r in measured for row in r["report"]["multiturn"]["per_turn"]})
    left.set_yscale("log")
    left.set_xticks(turns)
    middle.set_xticks(turns)
    left.set_xlabel("turn")
    left.set_ylabel("TTFT p50 (ms)")
    left.set_title("TTFT by turn")
    left.legend(fontsize="small")
    middle.set_ylim(0, 100)
    middle.set_xlabel("turn")
    middle.set_ylabel("% of prompt tokens from cache")
    middle.set_title("prefix reuse by turn")
    names = [r["config"] for r in measured]
    right.bar(range(len(names)), [device_rate(r) or 0.0 for r in measured])
    right.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize="small")
    right.set_ylabel("output tokens per device second")
    right.set_title("throughput (wall x time scale)")
    fig.tight_layout()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / NAME
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]
