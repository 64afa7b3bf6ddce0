"""From what a run gathered to its figures, verdict and report document.

`conclude(facts)`: the windows and drift of the soak phase's requests, each process's growth, the
notes (skipped faults, failed rollouts), the verdict (`verdict.judge`) and the report
(`report.build_report`). Times are wall seconds since the soak phase started; what is measured in
board time (settings' module docstring) is converted here: a window per board minute, the 10-minute
judging floor and the slopes' hour are board time. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from calculet.ops.soak.audit import AuditBook
from calculet.ops.soak.capacity import SoakCapacity
from calculet.ops.soak.chaos import FaultRecord
from calculet.ops.soak.drift import JUDGE_MIN_S, drift
from calculet.ops.soak.growth import GrowthBounds, ProcessSeries, series_growth
from calculet.ops.soak.report import ReportParts, build_report
from calculet.ops.soak.settings import SoakSettings
from calculet.ops.soak.supervisor import ExitRecord, OperatorAction
from calculet.ops.soak.tally import Tally
from calculet.ops.soak.verdict import SoakVerdict, VerdictInputs, judge
from calculet.ops.soak.windows import window_count, window_stats


@dataclass(frozen=True)
class RunFacts:
    """Everything a run gathered (the soak phase may be empty when the run stopped before it)."""

    settings: SoakSettings
    config: dict[str, Any]
    versions: dict[str, Any]
    capacity: SoakCapacity | None
    tallies: Mapping[str, Tally]
    duration_s: float
    series: Sequence[ProcessSeries]
    faults: Sequence[FaultRecord]
    exits: Sequence[ExitRecord]
    actions: Sequence[OperatorAction]
    budget_exhausted: Sequence[str]
    stuck: Sequence[str]
    audit: AuditBook
    boards_at_end: Mapping[str, bool]
    fatal: Sequence[str]
    timings: dict[str, float]
    references: dict[str, Any] = field(default_factory=dict)


def conclude(facts: RunFacts, bounds: GrowthBounds | None = None) -> tuple[dict[str, Any], SoakVerdict]:
    """The report document and the verdict (module docstring)."""
    bounds = bounds or GrowthBounds()
    s = facts.settings
    warmup, duration = s.warmup, facts.duration_s
    board_duration = duration / s.wall_per_board
    judge_min, hour = s.wall(JUDGE_MIN_S), s.wall(3600.0)
    points = facts.tallies["soak"].points if "soak" in facts.tallies else []
    windows = window_stats(points, duration, window_count(board_duration)) if duration > 0 else []
    cycle = s.cycle_s
    drifts = drift(points, windows, warmup, duration, cycle, judge_min) if duration > 0 else []
    growth = {x.pid: series_growth(x, warmup, duration, bounds, cycle, hour, judge_min) for x in facts.series}
    notes = [f"{r.kind} at {r.planned_s:.0f} s skipped: {r.note}" for r in facts.faults if r.outcome == "skipped"]
    notes += [f"{r.kind} at {r.planned_s:.0f} s failed: {_first_line(r.note)}" for r in facts.faults if _failed(r)]
    verdict = judge(
        VerdictInputs(
            tallies=facts.tallies,
            drift=drifts,
            growth={f"{x.name} (pid {x.pid})": growth[x.pid] for x in facts.series},
            boards_serving=facts.boards_at_end,
            budget_exhausted=facts.budget_exhausted,
            stuck=facts.stuck,
            fatal=facts.fatal,
            notes=notes,
        )
    )
    parts = ReportParts(
        config=facts.config,
        versions=facts.versions,
        capacity=facts.capacity,
        references=facts.references,
        tallies=facts.tallies,
        windows=windows,
        drift=drifts,
        series=facts.series,
        growth=growth,
        bounds=bounds,
        warmup_s=warmup,
        faults=facts.faults,
        exits=facts.exits,
        actions=facts.actions,
        audit=facts.audit,
        boards_at_end=facts.boards_at_end,
        timings=facts.timings,
        verdict=verdict,
    )
    return build_report(parts), verdict


def _failed(record: FaultRecord) -> bool:
    return record.outcome in ("rollout failed", "failed")


def _first_line(text: str) -> str:
    return text.splitlines()[0] if text else ""
