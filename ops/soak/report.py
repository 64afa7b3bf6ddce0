"""`soak.json`: everything the run measured and decided, in one document (schema `calculet.soak/1`).

Keys: `schema`, `verdict` (`result` PASS/FAIL, `reasons`, `notes`), `config` (the flags, cycle,
warm-up, daemon and gateway flags, the pool's mix), `versions`, `capacity` (method, capacity,
rate and how it was computed), `references`, `requests` (per phase: totals by class and kind,
allowed failures by rule and their rate, bounded examples with messages), `windows`, `drift`,
`processes` (per pid: whether it lived through the run, growth and slope of each metric, and its
samples `[t_s, rss_bytes, fds, threads, inbound]`, thinned to at most `MAX_SAMPLES_KEPT`), `faults` (every
fault: planned and acted time, board, pid, job indices, outcome) and `fault_counts`, `restarts`
(every board exit: status, cause, restart and back-to-serving times), `operator_actions`,
`audit` (per process: resets, budget, counters; every audit-trail entry seen, and counts by kind),
`boards_at_end`, `timings`. Figures that cannot be computed are null. Pure.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from calculet.ops.soak.audit import AuditBook
from calculet.ops.soak.capacity import SoakCapacity
from calculet.ops.soak.chaos import FaultRecord
from calculet.ops.soak.drift import DriftFigure
from calculet.ops.soak.growth import GrowthBounds, MetricGrowth, ProcessSeries, lived_through
from calculet.ops.soak.policy import describe_policy
from calculet.ops.soak.supervisor import ExitRecord, OperatorAction
from calculet.ops.soak.tally import Tally
from calculet.ops.soak.verdict import SoakVerdict
from calculet.ops.soak.windows import WindowStats

SCHEMA = "calculet.soak/1"
MAX_SAMPLES_KEPT = 1000


@dataclass(frozen=True)
class ReportParts:
    """The pieces of the report (module docstring)."""

    config: dict[str, Any]
    versions: dict[str, Any]
    capacity: SoakCapacity | None
    references: dict[str, Any]
    tallies: Mapping[str, Tally]
    windows: Sequence[WindowStats]
    drift: Sequence[DriftFigure]
    series: Sequence[ProcessSeries]
    growth: Mapping[int, Mapping[str, MetricGrowth]]
    bounds: GrowthBounds
    warmup_s: float
    faults: Sequence[FaultRecord]
    exits: Sequence[ExitRecord]
    actions: Sequence[OperatorAction]
    audit: AuditBook
    boards_at_end: Mapping[str, bool]
    timings: dict[str, float]
    verdict: SoakVerdict


def thin(rows: Sequence[Any], keep: int = MAX_SAMPLES_KEPT) -> list[Any]:
    """At most `keep` rows, evenly strided, the last one always kept."""
    if len(rows) <= keep:
        return list(rows)
    step = len(rows) / (keep - 1)
    return [rows[min(len(rows) - 1, round(i * step))] for i in range(keep - 1)] + [rows[-1]]


def process_json(series: ProcessSeries, growth: Mapping[str, MetricGrowth], warmup_s: float) -> dict[str, Any]:
    samples = [[round(s.t_s, 3), s.rss_bytes, s.fds, s.threads, s.inbound] for s in series.samples]
    return {
        "name": series.name,
        "role": series.role,
        "pid": series.pid,
        "samples_taken": len(samples),
        "first_s": samples[0][0] if samples else None,
        "last_s": samples[-1][0] if samples else None,
        "ended": series.ended,
        "lived_through": lived_through(series, warmup_s),
        "metrics": {name: m.to_json() for name, m in growth.items()},
        "samples": thin(samples),
    }


def build_report(parts: ReportParts) -> dict[str, Any]:
    """The document (module docstring)."""
    return {
        "schema": SCHEMA,
        "verdict": parts.verdict.to_json(),
        "config": parts.config,
        "versions": parts.versions,
        "capacity": None if parts.capacity is None else parts.capacity.to_json(),
        "references": parts.references,
        "policy": describe_policy(),
        "requests": {phase: tally.to_json() for phase, tally in parts.tallies.items()},
        "windows": [w.to_json() for w in parts.windows],
        "drift": [d.to_json() for d in parts.drift],
        "growth_bounds": parts.bounds.describe(),
        "processes": [process_json(s, parts.growth.get(s.pid, {}), parts.warmup_s) for s in parts.series],
        "faults": [f.to_json() for f in parts.faults],
        "fault_counts": _fault_counts(parts.faults),
        "restarts": [e.to_json() for e in parts.exits],
        "operator_actions": [a.to_json() for a in parts.actions],
        "audit": {
            "processes": [a.to_json() for a in parts.audit.processes()],
            "entries": parts.audit.entries(),
            "entries_by_kind": parts.audit.kinds(),
        },
        "boards_at_end": dict(parts.boards_at_end),
        "timings": {k: round(v, 3) for k, v in parts.timings.items()},
    }


def _fault_counts(faults: Sequence[FaultRecord]) -> dict[str, dict[str, int]]:
    """Per kind, faults by outcome."""
    out: dict[str, Counter[str]] = {}
    for f in faults:
        out.setdefault(f.kind, Counter())[f.outcome] += 1
    return {k: dict(v) for k, v in sorted(out.items())}
