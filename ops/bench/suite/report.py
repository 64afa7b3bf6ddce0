"""The suite's markdown report, rendered from its JSON document (so the two cannot disagree).

Sections: what made it (the suite command, the host, the time-scale rule); the configurations
(policy, in-flight, decode batch, boards, package, time scale, daemon flags); then per workload two
tables — latencies (TTFT, TPOT, ITL, E2E p50 / p95 / p99 in ms) and throughput against the
timing-model limit with the relative figures (each over the modelled device time, so independent of
the time scale), the busy ratios and host CPU — each followed by the `calctl bench` command of every
row. A figure that could not be computed is "n/a". Pure function of the document; no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from calculet.ops.bench.suite.markdown import NA, commands, errors, get, num, pct, table

QUANTILES = ("p50", "p95", "p99")


def _quantiles(stats: dict[str, Any] | None, fmt: str = ".1f") -> str:
    if not stats:
        return NA
    return " / ".join(num(stats.get(q), fmt) for q in QUANTILES)


def _run_label(record: dict[str, Any]) -> list[str]:
    return [record["config"], record["target"], str(record["concurrency"]), f"{record['time_scale']:g}"]


def latency_rows(records: Sequence[dict[str, Any]]) -> list[list[str]]:
    rows = []
    for r in records:
        counts = get(r, "report", "counts") or {}
        done = f"{counts.get('completed', 0)} / {counts.get('failed', 0)}" if counts else NA
        lat = [_quantiles(get(r, "report", "latency_ms", m)) for m in ("ttft", "tpot", "itl", "e2e")]
        rows.append([*_run_label(r), done, *lat])
    return rows


def wall_limit(record: dict[str, Any]) -> float | None:
    """The run's limit in output tokens per WALL second (the modelled limit over the time scale)."""
    modelled = get(record, "report", "timing_model", "limit", "output_tokens_per_s")
    scale = record["time_scale"]
    return modelled / scale if modelled is not None and scale > 0 else None


def throughput_rows(records: Sequence[dict[str, Any]]) -> list[list[str]]:
    rows = []
    for r in records:
        tm = get(r, "report", "timing_model") or {}
        rel = tm.get("relative") or {}
        cpu = r.get("host_cpu") or {}
        host = pct(cpu.get("host_busy")) + (" (limit!)" if cpu.get("host_limited") else "")
        rows.append([
            *_run_label(r),
            num(get(r, "report", "throughput", "output_tokens_per_s")),
            num(get(r, "report", "goodput", "output_tokens_per_s")),
            num(wall_limit(r)),
            num(rel.get("throughput"), ".3f"),
            pct(get(r, "report", "device", "busy_ratio")),
            pct(rel.get("busy_of_wall")),
            *(num(get(rel, m, "p50"), ".2f") for m in ("ttft", "tpot", "itl", "e2e")),
            num(get(tm, "tpot_excess_ms", "p50"), ".2f"),
            num(cpu.get("us_per_token_serving"), ".0f"),
            host,
        ])  # fmt: skip
    return rows


LATENCY_HEADER = ("config", "target", "C", "scale", "ok / failed", "TTFT ms", "TPOT ms", "ITL ms", "E2E ms")
THROUGHPUT_HEADER = (
    "config", "target", "C", "scale", "tok/s", "goodput tok/s", "limit tok/s", "tok/s / limit", "busy (device)",
    "busy of wall", "TTFT / floor", "TPOT / step", "ITL / step", "E2E / floor", "TPOT excess ms", "CPU us/token",
    "host busy",
)  # fmt: skip


def workload_section(name: str, records: Sequence[dict[str, Any]], made_by: str) -> list[str]:
    """The two tables of one workload, and the commands behind their rows."""
    w = records[0]["workload"]
    lo, hi = w["short_prompt"]
    long = f", {100 * w['long_fraction']:g} % long ({w['long_prompt']} tokens)" if w["long_fraction"] else ""
    out = [f"### workload `{name}`: prompts {lo}..{hi} tokens{long}, {w['output']} output tokens", ""]
    out += [f"Made by `{made_by}`; C is the total concurrency (closed loop), scale the calsim time scale.", ""]
    out += ["Latency, p50 / p95 / p99:", "", *table(LATENCY_HEADER, latency_rows(records)), ""]
    out += [
        "Throughput against the timing-model limit, and every latency over its modelled floor (p50):",
        "",
        *table(THROUGHPUT_HEADER, throughput_rows(records)),
        "",
    ]
    return out + commands(records) + errors(records)


def config_rows(configs: Sequence[dict[str, Any]]) -> list[list[str]]:
    return [
        [
            c["name"], c["policy"], str(c["max_inflight"]), str(c["decode_batch"]), str(c["boards"]), c["package"],
            f"{c['time_scale']:g}", "`" + " ".join(c["daemon_flags"]) + "`", c["error"] or "ok",
        ]
        for c in configs
    ]  # fmt: skip


CONFIG_HEADER = (
    "config",
    "policy",
    "in-flight",
    "decode batch",
    "boards",
    "package",
    "scale",
    "daemon flags",
    "status",
)


def render_markdown(doc: dict[str, Any]) -> str:
    """The whole report of a suite document (`calculet.bench-suite/1`)."""
    host = doc["host"]
    out = [
        f"# calctl bench suite: {doc['preset']}, {doc['mode']} matrix",
        "",
        f"Made by `{doc['command']}` on {host['cpus']} CPU(s); {len(doc['runs'])} runs.",
        "",
        f"Time scale: {doc['time_scale_rule']}",
        "",
        "## Configurations",
        "",
        *table(CONFIG_HEADER, config_rows(doc["configs"])),
        "",
        "## Results by workload",
        "",
    ]
    by_workload: dict[str, list[dict[str, Any]]] = {}
    for record in doc["runs"]:
        by_workload.setdefault(record["workload"]["name"], []).append(record)
    for name, records in by_workload.items():
        out += workload_section(name, records, doc["command"])
    return "\n".join(out).rstrip() + "\n"
