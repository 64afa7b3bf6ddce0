"""`soak.png`: the run at a glance, drawn with matplotlib (an optional extra, as for `calctl bench
--plot`: imported only here, and the soak goes on without a plot when it is missing).

Panels: TTFT and TPOT p50/p99 per window (ms, log scale) with a marker line at every fault acted
on (one colour per kind); requests per second per window, ok and not ok, with output tokens/s on
a second axis; and RSS (MiB), open fds less inbound client connections (the judged figure:
`growth.UsageSample`) and threads per process over time (one line per pid).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

MIB = 1024 * 1024


def plot_available() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def write_plot(path: Path, report: dict[str, Any], series: list[dict[str, Any]]) -> None:
    """Draw the report into `path` (PNG). `series` are the processes' sample lists
    (`[t_s, rss_bytes, fds, threads, inbound]` rows, with `name` and `pid`).

    Raises:
        ImportError: matplotlib is missing.
        OSError: the file cannot be written.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    windows = report["windows"]
    mids = [(w["start_s"] + w["end_s"]) / 2 for w in windows]
    fig, axes = plt.subplots(3, 2, figsize=(14, 11))
    (ttft, tpot), (rate, rss), (fds, threads) = axes
    for ax, key, title in ((ttft, "ttft_ms", "TTFT"), (tpot, "tpot_ms", "TPOT")):
        for q, style in (("p50", "-"), ("p99", "--")):
            ys = [w[key][q] for w in windows]
            ax.plot([m for m, y in zip(mids, ys, strict=True) if y], [y for y in ys if y], style, label=q)
        ax.set_yscale("log")
        ax.set_ylabel("ms")
        ax.set_title(f"{title} per window")
        kinds = _fault_lines(ax, report["faults"])
        ax.legend(loc="upper left", fontsize=7)
    if kinds:  # a second legend on the TTFT panel (the first stays as an artist): the faults' colours
        ttft.add_artist(ttft.get_legend())
        handles = [Line2D([0], [0], color=color, linewidth=2) for color in kinds.values()]
        ttft.legend(handles, list(kinds), loc="upper right", fontsize=6, title="faults")
    ok = [w["counts"]["ok"] / (w["end_s"] - w["start_s"]) for w in windows]
    bad = [(sum(w["counts"].values()) - w["counts"]["ok"]) / (w["end_s"] - w["start_s"]) for w in windows]
    rate.plot(mids, ok, label="ok requests/s")
    rate.plot(mids, bad, label="other requests/s")
    rate.set_ylabel("requests/s")
    rate.set_title("throughput per window")
    twin = rate.twinx()
    twin.plot(mids, [w["output_tokens_per_s"] for w in windows], color="tab:gray", alpha=0.6, label="tokens/s")
    twin.set_ylabel("output tokens/s")
    rate.legend(loc="upper left", fontsize=7)
    _fault_lines(rate, report["faults"])
    panels: tuple[tuple[Any, Callable[[list[float]], float], str], ...] = (
        (rss, lambda r: r[1] / MIB, "RSS (MiB)"),
        (fds, lambda r: r[2] - (r[4] if len(r) > 4 else 0), "open fds less inbound connections"),
        (threads, lambda r: r[3], "threads"),
    )
    for ax, value, title in panels:
        for s in series:
            rows = s["samples"]
            ax.plot([r[0] for r in rows], [value(r) for r in rows], label=f"{s['name']} {s['pid']}")
        ax.set_title(f"{title} per process")
        ax.legend(loc="upper left", fontsize=6, ncol=2)
    for ax in axes.flat:
        ax.set_xlabel("s since the soak started")
    verdict = report["verdict"]["result"]
    fig.suptitle(f"calctl soak: {report['config']['duration']} on {report['config']['preset']}: {verdict}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


PALETTE = (
    "tab:red", "tab:orange", "tab:olive", "tab:cyan", "tab:purple", "tab:brown", "tab:pink", "tab:green",
    "tab:gray", "black",
)  # fmt: skip


def _fault_lines(ax: Any, faults: list[dict[str, Any]]) -> dict[str, str]:
    """A vertical line at each fault acted on, one colour per kind; returns kind -> colour."""
    colors: dict[str, str] = {}
    for f in faults:
        if f.get("acted_s") is None:
            continue
        color = colors.setdefault(f["kind"], PALETTE[len(colors) % len(PALETTE)])
        ax.axvline(f["acted_s"], color=color, alpha=0.35, linewidth=0.8)
    return colors
