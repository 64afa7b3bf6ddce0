"""`--plot OUT.png`: the run's latency percentiles and throughput over time, drawn with matplotlib.

matplotlib is an optional extra (`pip install 'calculet[bench]'`, included in `dev`): it is imported
only here, only when a plot is asked for, and `require_matplotlib` refuses the run before it starts
when it is missing. Left panel: TTFT, TPOT, ITL and E2E at p50/p90/p99 (ms, log scale). Right
panel: output tokens per second over the measured window (`BUCKETS` equal buckets; a chunk whose
token count is unknown counts the request's tokens shared equally among its chunks) and the
requests in flight.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from calculet.common.errors import FailedPrecondition
from calculet.ops.bench.records import RequestRecord

BUCKETS = 50
METRICS = ("ttft", "tpot", "itl", "e2e")
QUANTILES = ("p50", "p90", "p99")


def require_matplotlib() -> None:
    """Raises: FailedPrecondition: matplotlib is not installed (says how to install it)."""
    if importlib.util.find_spec("matplotlib") is None:
        raise FailedPrecondition("--plot needs matplotlib: pip install 'calculet[bench]'")


def token_times(records: Sequence[RequestRecord]) -> list[tuple[float, float]]:
    """(arrival time, tokens) of every chunk of the successful records."""
    out = []
    for record in records:
        if not record.ok:
            continue
        share = record.output_tokens / len(record.chunks)
        out += [(c.time, float(c.tokens) if c.tokens is not None else share) for c in record.chunks]
    return out


def throughput_series(
    records: Sequence[RequestRecord], start: float, duration: float
) -> tuple[list[float], list[float], list[int]]:
    """Bucket centres (s from the window start), output tokens/s and requests in flight per bucket."""
    width = duration / BUCKETS if duration > 0 else 1.0
    tokens = [0.0] * BUCKETS
    for time, n in token_times(records):
        tokens[min(int((time - start) / width), BUCKETS - 1)] += n
    centres = [(i + 0.5) * width for i in range(BUCKETS)]
    in_flight = [
        sum(1 for r in records if r.start - start <= c < (r.end if r.end is not None else r.start) - start)
        for c in centres
    ]
    return centres, [t / width for t in tokens], in_flight


def write_plot(path: Path, report: dict[str, Any], records: Sequence[RequestRecord], start: float) -> None:
    """Draw the two panels into `path` (PNG).

    Raises:
        FailedPrecondition: matplotlib is missing.
        OSError: the file cannot be written.
    """
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.8))
    for i, q in enumerate(QUANTILES):
        values = [report["latency_ms"][m][q] or 0.0 for m in METRICS]
        left.bar([x + (i - 1) * 0.27 for x in range(len(METRICS))], values, width=0.27, label=q)
    left.set_xticks(range(len(METRICS)), [m.upper() for m in METRICS])
    left.set_yscale("symlog", linthresh=1.0)
    left.set_ylabel("ms")
    left.set_title("latency percentiles")
    left.legend()
    centres, rate, in_flight = throughput_series(records, start, report["duration_s"])
    right.plot(centres, rate, color="tab:blue", label="output tokens/s")
    right.set_xlabel("s since the window start")
    right.set_ylabel("output tokens/s", color="tab:blue")
    twin = right.twinx()
    twin.step(centres, in_flight, where="mid", color="tab:orange", label="in flight")
    twin.set_ylabel("requests in flight", color="tab:orange")
    twin.set_ylim(bottom=0)
    right.set_ylim(bottom=0)
    right.set_title(f"throughput ({report['throughput']['output_tokens_per_s'] or 0:.1f} tokens/s overall)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
