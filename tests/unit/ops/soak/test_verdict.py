"""The verdict's rules: correctness, the failure policy and its rate, boards at the end, drift and
growth (judged or not)."""

from __future__ import annotations

from calculet.ops.soak.classify import Judgement, RequestClass
from calculet.ops.soak.drift import Comparison, DriftFigure
from calculet.ops.soak.growth import MetricGrowth
from calculet.ops.soak.tally import Tally
from calculet.ops.soak.verdict import VerdictInputs, judge
from tests.unit.ops.soak.factories import point


def tally(ok: int = 100, **others: int) -> Tally:
    t = Tally()
    for _ in range(ok):
        t.add(point(1.0), Judgement(RequestClass.OK), "r", 0)
    for name, count in others.items():
        cls = RequestClass.FAILED if name.startswith("failed") else RequestClass(name)
        rule = "unavailable" if name == "failed_allowed" else None
        for _ in range(count):
            t.add(point(1.0, cls), Judgement(cls, rule, "why"), "r", 0)
    return t


def inputs(soak: Tally, **kw: object) -> VerdictInputs:
    settings: dict[str, object] = {
        "tallies": {"calibration": tally(5), "soak": soak},
        "drift": [],
        "growth": {},
        "boards_serving": {"board0": True, "board1": True},
    }
    settings.update(kw)
    return VerdictInputs(**settings)  # type: ignore[arg-type]


def test_a_clean_run_passes_with_notes_on_what_was_not_judged() -> None:
    verdict = judge(inputs(tally(cancelled=3, failed_allowed=2)))
    assert verdict.passed and any("growth not judged" in n for n in verdict.notes)


def test_any_lost_or_crossed_request_fails() -> None:
    assert "1 lost" in judge(inputs(tally(lost=1))).reasons[0]
    assert "1 crossed" in judge(inputs(tally(crossed=1))).reasons[0]


def test_a_disallowed_failure_fails_and_allowed_ones_above_the_rate_fail() -> None:
    assert not judge(inputs(tally(failed_disallowed=1))).passed
    assert judge(inputs(tally(ok=98, failed_allowed=2))).passed  # 2 %: at the bound
    over = judge(inputs(tally(ok=97, failed_allowed=3)))
    assert not over.passed and "above 2%" in over.reasons[0]


def test_a_calibration_failure_counts_too() -> None:
    verdict = judge(inputs(tally(), tallies={"calibration": tally(crossed=1), "soak": tally()}))
    assert verdict.reasons == ("calibration: 1 crossed request(s)",)


def test_boards_not_serving_exhausted_budgets_stuck_boards_and_fatal_errors_fail() -> None:
    verdict = judge(
        inputs(
            tally(),
            boards_serving={"board0": True, "board1": False},
            budget_exhausted=["board0 (pid 1): budget"],
            stuck=["board1 (pid 2): NOT_SERVING for 120 s"],
            fatal=["the gateway stopped"],
        )
    )
    assert len(verdict.reasons) == 4 and "board1 is not SERVING at the end" in verdict.reasons


def figure(metric: str, level: float, trend: float = 0.0, requests: float = 0.0, judged: bool = True) -> DriftFigure:
    return DriftFigure(
        metric,
        Comparison(1.0, 1.0 + level),
        Comparison(1.0, 1.0 + trend),
        Comparison(1.0, 1.0 + requests),
        (5, 5),
        (50, 50),
        judged,
        "" if judged else "n",
    )


def test_drift_of_the_level_or_the_trend_above_the_bound_fails() -> None:
    verdict = judge(inputs(tally(), drift=[figure("ttft", 0.35), figure("tpot", 0.1, trend=0.25)]))
    assert verdict.reasons == (
        "p99 TTFT drifted: level +35.0%, trend +0.0% (bound +20%; last 10 % against the first after the warm-up)",
        "p99 TPOT drifted: level +10.0%, trend +25.0% (bound +20%; last 10 % against the first after the warm-up)",
    )


def test_the_requests_p99_is_reported_not_judged_and_unjudged_drift_is_a_note() -> None:
    noisy = figure("tpot", 0.1, trend=-0.15, requests=0.216)
    assert not noisy.drifted and noisy.to_json()["requests"]["change"] == 0.216
    assert judge(inputs(tally(), drift=[noisy])).passed
    quiet = judge(inputs(tally(), drift=[figure("ttft", 0.9, judged=False)]))
    assert quiet.passed and any("TTFT drift" in n for n in quiet.notes)


def test_growth_over_its_bound_fails() -> None:
    over = MetricGrowth("fds", 30.0, 60.0, 30.0, 12.0, 16.0, True, True)
    within = MetricGrowth("threads", 10.0, 12.0, 2.0, 1.0, 8.0, True, False)
    verdict = judge(inputs(tally(), growth={"gateway (pid 9)": {"fds": over, "threads": within}}))
    assert verdict.reasons == ("gateway (pid 9): fds grew by 30 (bound 16)",)
