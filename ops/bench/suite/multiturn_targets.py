"""Issue 19's targets across the runs of the multi-turn comparison (`multiturn.targets` has the rules).

From the suite's run records (their `calctl bench` reports):
- per run with prefix reuse on, the two per-run targets its report already checked (`cache`: turns
  >= 2 at least 90 % from cache; `ttft`: turns >= 2 TTFT p50 within 1.2 x the modelled uncached
  cost + 50 ms);
- `reuse`, per fleet size: output throughput of reuse on (prefix routing on several boards, load
  on one) over reuse off (load routing), at least 3 x;
- `scaling`, per fleet size B > 1 when one board ran too: reuse on with prefix routing on B boards
  over reuse on with one board, at least 0.9 x B (3.6 x for 4 boards).

Throughputs are compared in device time (output tokens per wall second x the run's time scale), so
runs at different time scales compare; at time scale 0 the wall figures are compared as they are.
Each entry: `runs` (which runs it compares) and the `TargetCheck` fields. Pure; reads the records only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from calculet.ops.bench.multiturn.targets import REUSE_SPEEDUP_MIN, SCALING_MIN, ratio_target
from calculet.ops.bench.suite.multiturn import LOAD, PREFIX

SCALING_PER_BOARD = SCALING_MIN / 4  # the 3.6 x for 4 boards


def device_rate(record: dict[str, Any]) -> float | None:
    """Output tokens per device second: per wall second x the time scale (as measured at scale 0)."""
    report = record.get("report") or {}
    rate = (report.get("throughput") or {}).get("output_tokens_per_s")
    if rate is None:
        return None
    scale = record["time_scale"]
    return rate * scale if scale > 0 else rate


def _find(records: Sequence[dict[str, Any]], boards: int, reuse: bool, routing: str) -> dict[str, Any] | None:
    return next(
        (r for r in records if (r["boards"], r["prefix_reuse"], r["routing"]) == (boards, reuse, routing)), None
    )


def _pair(
    name: str, wanted: str, on: dict[str, Any] | None, off: dict[str, Any] | None, least: float
) -> dict[str, Any]:
    target = ratio_target(name, wanted, device_rate(on) if on else None, device_rate(off) if off else None, least)
    runs = f"{on['config'] if on else '(not run)'} / {off['config'] if off else '(not run)'}"
    return {"runs": runs} | target.as_json()


def suite_targets(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every target the runs allow checking (module docstring), in a stable order."""
    out = []
    for r in records:
        mt = (r.get("report") or {}).get("multiturn")
        if r["prefix_reuse"] and mt is not None:
            out += [{"runs": r["config"]} | t for t in mt["targets"]]
    sizes = sorted({r["boards"] for r in records})
    for b in sizes:
        on = _find(records, b, True, PREFIX if b > 1 else LOAD)
        off = _find(records, b, False, LOAD)
        if on is not None or off is not None:
            wanted = f"x{b}: output tokens/s with reuse on >= {REUSE_SPEEDUP_MIN:g} x reuse off"
            out.append(_pair("reuse", wanted, on, off, REUSE_SPEEDUP_MIN))
    one = _find(records, 1, True, LOAD)
    for b in sizes:
        if b > 1 and one is not None:
            least = SCALING_PER_BOARD * b
            wanted = f"x{b} over x1 (reuse on): output tokens/s >= {least:g} x"
            out.append(_pair("scaling", wanted, _find(records, b, True, PREFIX), one, least))
    return out
