"""The A/B report of `calctl bench compare` (docs/sources.md 000 §11, §16 M6: a parallelism is chosen
by measurement): two packages' runs of the same workload, side by side, and the verdict by goodput.

Pure functions over what the runs produced: `side_json` takes a package's manifest and its suite
run record (`suite.runner.measured`: the `calctl bench` report inside) to the figures compared;
`device_tokens_per_s` is the board's generated tokens per second of its DEVICE clock (calsim's clock
advances only with modelled work), what the package alone allows whatever the host did meanwhile:
beside the verdict it tells a package's difference from the host's noise on a shared machine;
`limit_tokens_per_s` is the timing model's limit for the run (`limit.py`, which charges the declared
D2D as calsim does): what a perfect host would get.
`verdict` picks the side whose goodput (SLO-meeting output tokens per second, the bench's
`goodput.output_tokens_per_s`) is higher by more than `margin`, else none ("within the margin": a
difference the run cannot tell from noise); `compare_json` is the whole document, `markdown` its
table for docs/performance.md, `render` the same on the terminal.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from rich.table import Table

from calculet.daemon.package.manifest import PackageManifest

DEFAULT_MARGIN = 0.02  # a 2 % difference in goodput decides; below it, the runs tie


def _get(tree: Any, *path: str) -> Any:
    """`tree[path[0]][path[1]]...`, None where a level is missing or null."""
    for key in path:
        if not isinstance(tree, dict):
            return None
        tree = tree.get(key)
    return tree


def side_json(label: str, manifest: PackageManifest, record: dict[str, Any]) -> dict[str, Any]:
    """One package's figures: its declared split and traffic, and what its run measured (None where
    the run has no such figure: it failed, or the board could not be read)."""
    report = record.get("report") or {}
    d2d = manifest.topology.d2d
    boards = _get(report, "device", "boards") or []
    board = boards[0] if boards else {}
    compute = _get(board, "phases_s", "compute")
    link_s = _get(board, "d2d", "seconds")
    moved = _get(board, "d2d", "bytes")
    tokens = _get(report, "counts", "output_tokens")
    device_s, generated = _get(board, "device_s"), _get(board, "generated_tokens")
    return {
        "label": label,
        "package": manifest.name,
        "path": record.get("package_path"),
        "parallelism": manifest.topology.parallelism,
        "d2d_bytes_per_token": d2d.bytes_per_token if d2d is not None else None,
        "d2d_syncs_per_job": d2d.syncs_per_job if d2d is not None else None,
        "error": record.get("error"),
        "completed": _get(report, "counts", "completed"),
        "failed": _get(report, "counts", "failed"),
        "output_tokens_per_s": _get(report, "throughput", "output_tokens_per_s"),
        "goodput_tokens_per_s": _get(report, "goodput", "output_tokens_per_s"),
        "goodput_requests_per_s": _get(report, "goodput", "requests_per_s"),
        "good_requests": _get(report, "goodput", "good_requests"),
        "ttft_ms": {"p50": _get(report, "latency_ms", "ttft", "p50"), "p99": _get(report, "latency_ms", "ttft", "p99")},
        "tpot_ms": {"p50": _get(report, "latency_ms", "tpot", "p50"), "p99": _get(report, "latency_ms", "tpot", "p99")},
        "busy_ratio": _get(report, "device", "busy_ratio"),
        "device_tokens_per_s": generated / device_s if generated is not None and device_s else None,
        "limit_tokens_per_s": _get(report, "timing_model", "limit", "output_tokens_per_s"),
        "d2d_share_of_compute": link_s / compute if link_s is not None and compute else None,
        "d2d_bytes_per_output_token": moved / tokens if moved is not None and tokens else None,
        "time_scale": record.get("time_scale"),
    }


def host_check(winner: dict[str, Any], other: dict[str, Any], margin: float) -> str | None:
    """A warning when the device clock does not back a goodput win: the winner's tokens per
    device-clock second lead by less than `margin` (or trail), so the host's noise, not the package,
    decided the wall-clock figures. None when it backs it or a figure is missing."""
    mine, theirs = winner["device_tokens_per_s"], other["device_tokens_per_s"]
    if not mine or not theirs or mine / theirs - 1 >= margin:
        return None
    return (
        f"the device clock does not back it: {winner['label']} makes {mine / theirs - 1:+.1%} tokens per device"
        f" second, within the {margin:.0%} margin; the host's load moved the wall-clock figures"
    )


def verdict(a: dict[str, Any], b: dict[str, Any], margin: float = DEFAULT_MARGIN) -> dict[str, Any]:
    """Which side serves more goodput: `winner` (its label, or None), `ratio` (b's goodput over a's),
    `reason`, one sentence, and `caution` (`host_check`: a win the device clock does not back, else
    None)."""
    ga, gb = a["goodput_tokens_per_s"], b["goodput_tokens_per_s"]
    broken = [s["label"] for s in (a, b) if s["error"] or s["goodput_tokens_per_s"] is None]
    if broken:
        reason = f"no verdict: {', '.join(broken)} has no goodput figure"
        return {"winner": None, "ratio": None, "reason": reason, "caution": None}
    if ga <= 0 and gb <= 0:
        return {"winner": None, "ratio": None, "reason": "no verdict: neither side met the SLO", "caution": None}
    ratio = gb / ga if ga > 0 else None
    best, other = (b, a) if gb > ga else (a, b)
    lead = (best["goodput_tokens_per_s"] / other["goodput_tokens_per_s"] - 1) if other["goodput_tokens_per_s"] else None
    if lead is not None and lead < margin:
        reason = f"tie: goodput within {margin:.0%} ({lead:+.1%} for {best['label']})"
        return {"winner": None, "ratio": ratio, "reason": reason, "caution": None}
    who = f"{best['label']} ({best['parallelism']})"
    if lead is None:
        reason = f"{who}: {other['label']} ({other['parallelism']}) met the SLO on no request"
    else:
        reason = f"{who}: goodput {lead:+.1%} over {other['label']} ({other['parallelism']})"
    return {"winner": best["label"], "ratio": ratio, "reason": reason, "caution": host_check(best, other, margin)}


def compare_json(
    header: dict[str, Any], sides: Sequence[dict[str, Any]], margin: float = DEFAULT_MARGIN
) -> dict[str, Any]:
    """The comparison document: how it was run, both sides, the verdict."""
    a, b = sides
    return {"schema": "calculet.bench.compare/1", **header, "margin": margin, "sides": list(sides),
            "verdict": verdict(a, b, margin)}  # fmt: skip


def _fmt(value: Any, spec: str = ".1f") -> str:
    return "n/a" if value is None else format(value, spec)


def _declared(s: dict[str, Any]) -> str:
    if s["d2d_bytes_per_token"] is None:
        return "none"
    return f"{s['d2d_bytes_per_token']:,}, {s['d2d_syncs_per_job']}"


def _good(s: dict[str, Any]) -> str:
    return f"{_fmt(s['goodput_requests_per_s'], '.2f')} ({_fmt(s['good_requests'], 'd')})"


def _p50_p99(s: dict[str, Any], name: str) -> str:
    return f"{_fmt(s[name]['p50'])} / {_fmt(s[name]['p99'])}"


ROWS: tuple[tuple[str, Callable[[dict[str, Any]], str]], ...] = (
    ("package", lambda s: s["package"]),
    ("parallelism", lambda s: s["parallelism"]),
    ("declared D2D bytes/token, syncs/job", _declared),
    ("completed / failed", lambda s: f"{_fmt(s['completed'], 'd')} / {_fmt(s['failed'], 'd')}"),
    ("output tokens/s", lambda s: _fmt(s["output_tokens_per_s"])),
    ("goodput output tokens/s", lambda s: _fmt(s["goodput_tokens_per_s"])),
    ("goodput requests/s (good)", _good),
    ("TTFT p50 / p99 ms", lambda s: _p50_p99(s, "ttft_ms")),
    ("TPOT p50 / p99 ms", lambda s: _p50_p99(s, "tpot_ms")),
    ("device busy", lambda s: _fmt(s["busy_ratio"], ".1%")),
    ("tokens per device-clock second", lambda s: _fmt(s["device_tokens_per_s"])),
    ("timing-model limit tokens/s", lambda s: _fmt(s["limit_tokens_per_s"])),
    ("D2D share of compute", lambda s: _fmt(s["d2d_share_of_compute"], ".2%")),
    ("D2D bytes/output token", lambda s: _fmt(s["d2d_bytes_per_output_token"], ",.0f")),
)


def markdown(doc: dict[str, Any]) -> str:
    """The side-by-side table and the verdict, as Markdown."""
    a, b = doc["sides"]
    lines = [f"| | {a['label']} | {b['label']} |", "| --- | ---: | ---: |"]
    lines += [f"| {name} | {cell(a)} | {cell(b)} |" for name, cell in ROWS]
    v = doc["verdict"]
    lines += ["", f"Verdict (by goodput, margin {doc['margin']:.0%}): {v['reason']}."]
    lines += [f"Caution: {v['caution']}."] if v.get("caution") else []
    return "\n".join(lines) + "\n"


def render(doc: dict[str, Any]) -> Table:
    """The side-by-side table on the terminal, the verdict as its caption."""
    a, b = doc["sides"]
    table = Table(title=f"bench compare: {doc.get('workload', '')}", title_justify="left",
                  caption=f"verdict (goodput, margin {doc['margin']:.0%}): {doc['verdict']['reason']}"
                          + (f"\ncaution: {doc['verdict']['caution']}" if doc["verdict"].get("caution") else ""),
                  caption_justify="left")  # fmt: skip
    table.add_column("")
    table.add_column(a["label"], justify="right")
    table.add_column(b["label"], justify="right")
    for name, cell in ROWS:
        table.add_row(name, cell(a), cell(b))
    return table
