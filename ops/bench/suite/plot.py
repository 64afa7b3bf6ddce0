"""The suite's plots: for each workload run at two or more concurrencies, latency and throughput
against load, one line per configuration and target, drawn from the suite document.

Left: output tokens/s (solid) and the timing-model limit at the same load (dashed, per wall second at
the run's time scale); middle: TTFT p50; right: TPOT p50 (ms); x: total concurrency (log 2). A run
without the figure is left out. matplotlib is optional (`calculet[bench]`) and imported only here;
`plot.require_matplotlib` says how to install it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from calculet.ops.bench.plot import require_matplotlib
from calculet.ops.bench.suite.report import wall_limit

Series = dict[str, list[tuple[int, float]]]


def series(records: Sequence[dict[str, Any]], figure: tuple[str, ...]) -> Series:
    """`label -> [(concurrency, value)]` of the records' `report[figure...]`, sorted by concurrency."""
    out: Series = {}
    for r in records:
        value: Any = r.get("report")
        for key in figure:
            value = value.get(key) if isinstance(value, dict) else None
        if isinstance(value, int | float):
            out.setdefault(f"{r['config']} {r['target']}", []).append((r["concurrency"], float(value)))
    return {label: sorted(points) for label, points in out.items()}


def limit_series(records: Sequence[dict[str, Any]]) -> Series:
    out: Series = {}
    for r in records:
        value = wall_limit(r)
        if value is not None:
            out.setdefault(f"{r['config']} {r['target']}", []).append((r["concurrency"], value))
    return {label: sorted(points) for label, points in out.items()}


def plottable(records: Sequence[dict[str, Any]]) -> bool:
    """Worth a plot: at least two concurrencies."""
    return len({r["concurrency"] for r in records}) >= 2


def write_workload_plot(path: Path, workload: str, records: Sequence[dict[str, Any]]) -> None:
    """Draw one workload's three panels into `path` (PNG).

    Raises:
        FailedPrecondition: matplotlib is missing.
        OSError: the file cannot be written.
    """
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(17, 5))
    panels = (
        (("throughput", "output_tokens_per_s"), "output tokens/s"),
        (("latency_ms", "ttft", "p50"), "TTFT p50 (ms)"),
        (("latency_ms", "tpot", "p50"), "TPOT p50 (ms)"),
    )
    limits = limit_series(records)
    for ax, (figure, title) in zip(axes, panels, strict=True):
        for i, (label, points) in enumerate(series(records, figure).items()):
            colour = f"C{i % 10}"
            ax.plot(*zip(*points, strict=True), marker="o", color=colour, label=label)
            if figure[0] == "throughput" and label in limits:
                ax.plot(*zip(*limits[label], strict=True), linestyle="--", marker="x", color=colour, alpha=0.6)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrency (clients)")
        ax.set_title(title)
        ax.set_ylim(bottom=0)
    axes[0].legend(fontsize="small", title="dashed: timing-model limit")
    fig.suptitle(f"workload {workload}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_plots(out_dir: Path, runs: Sequence[dict[str, Any]]) -> list[Path]:
    """One PNG per plottable workload, `<out_dir>/<workload>.png`; returns the files written."""
    by_workload: dict[str, list[dict[str, Any]]] = {}
    for r in runs:
        by_workload.setdefault(r["workload"]["name"], []).append(r)
    written = []
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, records in by_workload.items():
        if plottable(records):
            path = out_dir / f"{name}.png"
            write_workload_plot(path, name, records)
            written.append(path)
    return written
