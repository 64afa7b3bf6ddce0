"""The soak's verdict: PASS, or FAIL with every reason. The run fails on:

- correctness: any `lost` or `crossed` request (the calibration's included);
- failures: any failure the policy does not allow, or allowed ones above
  `policy.MAX_ALLOWED_RATE` of the requests;
- boards: a board not SERVING at the end (after a grace), one that exhausted its automatic-reset
  budget (sized so that the fault plan cannot), or one that stayed NOT_SERVING until the harness
  restarted it (it did not recover by itself);
- the fleet: the gateway stopped, or the run was interrupted or could not finish;
- drift (runs of 10 minutes or more): p99 TTFT or p99 TPOT up by more than 20 %, by the level of
  the per-window p99 (last 10 % against the first 10 % after the warm-up) or by its trend
  (`drift`);
- growth (runs of 10 minutes or more): RSS, fds or threads of a process that lived through the run
  grew past `growth.GrowthBounds`;
- RSS slope (runs of 2 board-hours or more): the RSS of a process that lived through the run rose
  by more than 1 MB per board-hour after its first board-hour (`growth`, the late slope).

What is not judged is said in `notes` (short runs, too few samples, failed rollouts, skipped
faults). Pure: `judge` takes the figures the run computed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from calculet.ops.soak.classify import RequestClass
from calculet.ops.soak.drift import DRIFT_BOUND, DriftFigure
from calculet.ops.soak.growth import MetricGrowth
from calculet.ops.soak.policy import MAX_ALLOWED_RATE
from calculet.ops.soak.tally import Tally


@dataclass(frozen=True)
class SoakVerdict:
    """PASS when `reasons` is empty."""

    reasons: tuple[str, ...]
    notes: tuple[str, ...] = ()

    @property
    def passed(self) -> bool:
        return not self.reasons

    def to_json(self) -> dict[str, Any]:
        return {"result": "PASS" if self.passed else "FAIL", "reasons": list(self.reasons), "notes": list(self.notes)}


@dataclass(frozen=True)
class VerdictInputs:
    """What the verdict looks at.

    Attributes:
        tallies: the judged requests of each phase ("calibration", "soak").
        drift: the drift figures.
        growth: per process label ("gateway pid 123"), its metrics.
        boards_serving: per board, SERVING at the end.
        budget_exhausted: boards that exhausted their reset budget (one line each).
        stuck: boards the harness restarted because they stayed NOT_SERVING (one line each).
        fatal: what stopped the run early (gateway died, interrupted, an error).
        notes: things to say that do not fail the run.
    """

    tallies: Mapping[str, Tally]
    drift: Sequence[DriftFigure]
    growth: Mapping[str, Mapping[str, MetricGrowth]]
    boards_serving: Mapping[str, bool]
    budget_exhausted: Sequence[str] = ()
    stuck: Sequence[str] = ()
    fatal: Sequence[str] = ()
    notes: Sequence[str] = field(default_factory=tuple)


def judge(inputs: VerdictInputs) -> SoakVerdict:
    """Every rule of the module docstring."""
    reasons: list[str] = list(inputs.fatal)
    notes: list[str] = list(inputs.notes)
    for phase, tally in inputs.tallies.items():
        for cls in (RequestClass.LOST, RequestClass.CROSSED):
            if tally.by_class[cls.value]:
                reasons.append(f"{phase}: {tally.by_class[cls.value]} {cls.value} request(s)")
        if tally.disallowed:
            reasons.append(f"{phase}: {tally.disallowed} failure(s) the policy does not allow")
        if tally.total and tally.allowed / tally.total > MAX_ALLOWED_RATE:
            rate = tally.allowed / tally.total
            reasons.append(f"{phase}: allowed failures {rate:.2%} of requests, above {MAX_ALLOWED_RATE:.0%}")
    soak = inputs.tallies.get("soak")
    if soak is not None and not soak.total:
        reasons.append("soak: no request was judged")
    for board, serving in sorted(inputs.boards_serving.items()):
        if not serving:
            reasons.append(f"{board} is not SERVING at the end")
    reasons += [f"reset budget exhausted: {line}" for line in inputs.budget_exhausted]
    reasons += [f"restarted by the harness: {line}" for line in inputs.stuck]
    for figure in inputs.drift:
        if figure.drifted:
            level, trend = (f"{c:+.1%}" if c is not None else "n/a" for c in figure.judged_changes())
            what = f"p99 {figure.metric.upper()} drifted: level {level}, trend {trend}"
            reasons.append(f"{what} (bound +{DRIFT_BOUND:.0%}; last 10 % against the first after the warm-up)")
        elif not figure.judged:
            notes.append(f"p99 {figure.metric.upper()} drift {figure.note}")
    judged_any = late_judged_any = False
    for label, metrics in sorted(inputs.growth.items()):
        for name, m in metrics.items():
            judged_any |= m.judged
            late_judged_any |= m.late_judged
            if m.over and m.growth is not None and m.limit is not None:
                reasons.append(f"{label}: {name} grew by {m.growth:,.0f} (bound {m.limit:,.0f})")
            if m.late_over and m.late_slope_per_hour is not None and m.late_limit is not None:
                reasons.append(
                    f"{label}: {name} rose {m.late_slope_per_hour:,.0f} per board-hour after the first "
                    f"board-hour (bound {m.late_limit:,.0f})"
                )
    if not judged_any:
        notes.append("process growth not judged (run shorter than 10 minutes, or no process lived through it)")
    if not late_judged_any:
        notes.append("RSS slope after the first board-hour not judged (run shorter than 2 board-hours)")
    return SoakVerdict(tuple(reasons), tuple(notes))
