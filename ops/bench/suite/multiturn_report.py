"""The markdown report of the multi-turn comparison (`calctl bench suite --multiturn`), rendered from
the suite document (so the two cannot disagree).

Sections: what made it (the suite command, the host, the time-scale rule, the workload's sizes);
issue 19's targets, each with the runs it compares, what was wanted, the measured figure and met /
missed / not checked (`multiturn_targets`); the configurations (boards, prefix reuse, routing,
users, package, time scale, daemon and gateway flags); one results row per run (completed /
failed / skipped turns, output tokens/s on the wall and in device time, requests/s, goodput
tokens/s, the share from cache over all turns and from turn 2, the share the previous turn
carried, TTFT p50 of turn 1 and of turns >= 2 beside the modelled uncached TTFT, TPOT and ITL, host
busy); TTFT and cache share by turn for every run; the command of every run, and the errors. A
figure that could not be computed is "n/a". Pure function of the document; no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from calculet.ops.bench.multiturn.targets import TargetCheck
from calculet.ops.bench.suite.markdown import commands, errors, get, num, pct, table
from calculet.ops.bench.suite.multiturn_targets import device_rate, suite_targets

VERDICT = {True: "met", False: "**missed**", None: "not checked"}
TARGET_HEADER = ("target", "runs", "wanted", "measured", "verdict", "how")
CONFIG_HEADER = (
    "config", "boards", "prefix reuse", "routing", "users", "package", "scale", "daemon flags", "gateway flags",
    "status",
)  # fmt: skip
RESULT_HEADER = (
    "config", "ok / failed / skipped", "tok/s", "tok/s x scale", "req/s", "goodput tok/s", "from cache (all / t>=2)",
    "carried t>=2", "TTFT p50 t1 ms", "TTFT p50 t>=2 ms", "modelled uncached p50 ms", "TPOT p50 ms",
    "ITL p50 / p99 ms", "host busy",
)  # fmt: skip
TURN_HEADER = ("config", "turn", "ok", "TTFT p50 / p90 / p99 ms", "from cache", "carried", "modelled uncached ms")


def target_rows(records: Sequence[dict[str, Any]]) -> list[list[str]]:
    rows = []
    for t in suite_targets(records):
        target = TargetCheck(t["name"], t["wanted"], t["measured"], t["met"], t["detail"], t["unit"])
        rows.append([t["name"], t["runs"], t["wanted"], target.shown(), VERDICT[t["met"]], t["detail"]])
    return rows


def config_rows(configs: Sequence[dict[str, Any]]) -> list[list[str]]:
    return [
        [
            c["name"], str(c["boards"]), "on" if c["prefix_reuse"] else "off", c["routing"], str(c["users"]),
            c["package"], f"{c['time_scale']:g}", "`" + " ".join(c["daemon_flags"]) + "`",
            "`" + " ".join(c["gateway_flags"]) + "`", c["error"] or "ok",
        ]
        for c in configs
    ]  # fmt: skip


def _turn(record: dict[str, Any], k: int) -> dict[str, Any]:
    rows = get(record, "report", "multiturn", "per_turn") or []
    return rows[k - 1] if len(rows) >= k else {}


def _later_carried(record: dict[str, Any]) -> float | None:
    rows = (get(record, "report", "multiturn", "per_turn") or [])[1:]
    prompt = sum(r["prompt_tokens"] for r in rows)
    return sum(r["carried_tokens"] for r in rows) / prompt if prompt else None


def result_rows(records: Sequence[dict[str, Any]]) -> list[list[str]]:
    rows = []
    for r in records:
        report = r.get("report") or {}
        counts = report.get("counts") or {}
        mt = report.get("multiturn") or {}
        done = f"{counts['completed']} / {counts['failed']} / {mt.get('skipped', 0)}" if counts else "n/a"
        cpu = r.get("host_cpu") or {}
        itl = get(r, "report", "latency_ms", "itl") or {}
        rows.append([
            r["config"], done,
            num(get(r, "report", "throughput", "output_tokens_per_s")),
            num(device_rate(r)),
            num(get(r, "report", "throughput", "requests_per_s"), ".2f"),
            num(get(r, "report", "goodput", "output_tokens_per_s")),
            f"{pct(mt.get('cached_share'))} / {pct(mt.get('cached_share_later'))}",
            pct(_later_carried(r)),
            num(get(_turn(r, 1), "ttft_ms", "p50")),
            num(get(mt, "later_turns", "ttft_p50_ms")),
            num(get(mt, "later_turns", "modelled_uncached_ttft_p50_ms")),
            num(get(r, "report", "latency_ms", "tpot", "p50"), ".2f"),
            f"{num(itl.get('p50'), '.2f')} / {num(itl.get('p99'), '.2f')}",
            pct(cpu.get("host_busy")) + (" (limit!)" if cpu.get("host_limited") else ""),
        ])  # fmt: skip
    return rows


def turn_rows(records: Sequence[dict[str, Any]]) -> list[list[str]]:
    rows = []
    for r in records:
        for t in get(r, "report", "multiturn", "per_turn") or []:
            ttft = " / ".join(num(t["ttft_ms"][q]) for q in ("p50", "p90", "p99"))
            rows.append([
                r["config"], str(t["turn"]), f"{t['completed']} / {t['sent'] + t['skipped']}", ttft,
                pct(t["cached_share"]), pct(t["carried_share"]), num(t["modelled_uncached_ttft_ms"]),
            ])  # fmt: skip
    return rows


def render_multiturn_markdown(doc: dict[str, Any]) -> str:
    """The whole report of a multi-turn comparison document (`calculet.bench-suite/1`, mode multiturn)."""
    host, w, runs = doc["host"], doc["multiturn"], doc["runs"]
    think = "-".join(f"{v:g}" for v in dict.fromkeys(w["think_time_s"]))
    sizes = (
        f"{w['users_per_lane']:g} users per KV lane, {w['turns']} turns, a {w['system_tokens']}-token system "
        f"prompt, {w['user_tokens']} user tokens and {w['answer_tokens']}-token answers a turn, think time {think} s"
    )
    out = [
        f"# calctl bench suite: multi-turn comparison (issue 19), {doc['preset']}",
        "",
        f"Made by `{doc['command']}` on {host['cpus']} CPU(s); {len(runs)} runs.",
        "",
        f"Workload: {sizes}. Time scale: {doc['time_scale_rule']}",
        "",
        "## Targets of issue 19",
        "",
        *table(TARGET_HEADER, target_rows(runs)),
        "",
        "## Configurations",
        "",
        *table(CONFIG_HEADER, config_rows(doc["configs"])),
        "",
        "## Results",
        "",
        "tok/s x scale is the output rate in device time (what the throughput targets compare); t>=2: turns 2 on; "
        "carried: the previous turn's prompt and answer, the most per-lane reuse can serve.",
        "",
        *table(RESULT_HEADER, result_rows(runs)),
        "",
        "## By turn",
        "",
        *table(TURN_HEADER, turn_rows(runs)),
        "",
        *commands(runs),
        *errors(runs),
    ]
    return "\n".join(out).rstrip() + "\n"
