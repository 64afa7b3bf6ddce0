"""Issue 30, defect 5: the quarantine's golden re-check (`core/golden.py`) without a device: scripted
probe runs and a modelled clock. It judges the model, not the weather: a run is judged on its output,
whatever faults it re-prefilled past; disturbed runs are run again within a bound of runs and of
time; a mismatch fails it only when it reproduces; a board that refuses probes ends it without a
verdict."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from calculet.common.errors import ErrorKind, InvalidArgument, Unavailable
from calculet.daemon.core.engine_types import ProbeOutcome
from calculet.daemon.core.events import FinalEvent, FinishReason, Timings, Usage
from calculet.daemon.core.golden import RECHECK_ATTEMPTS, REPRODUCE, AttemptResult, GoldenVerdict, judge, recheck
from calculet.daemon.package.manifest import GoldenDecl

LOGITS = np.array([0.5, 3.0, 1.0, -2.0], dtype=np.float32)
GOLDEN = GoldenDecl(prompt_tokens=(1, 2), prefill_top=((1, 3.0), (2, 1.0)), decode_tokens=(1, 2, 3), logit_atol=0.01)
TIMEOUT = 120.0


def probe(tokens: tuple[int, ...] = (1, 2, 3), *, recoveries: int = 0, nonfinite: int = 0) -> ProbeOutcome:
    final = FinalEvent(len(tokens), FinishReason.LENGTH, Usage(2, len(tokens)), Timings())
    return ProbeOutcome(final, tokens, LOGITS, recoveries, nonfinite)


def out_of_re_prefills(recoveries: int = 4, nonfinite: int = 0) -> ProbeOutcome:
    """A probe that ended ABORTED after `recoveries` lost KV, `nonfinite` of them NaN/Inf."""
    why = "non-finite logits from the device" if nonfinite == recoveries else "device job ended ccu_exception"
    final = FinalEvent(
        1, FinishReason.ERROR, Usage(2, 1), Timings(), ErrorKind.ABORTED, f"{why} (recovery budget exhausted)"
    )
    return ProbeOutcome(final, (1,), LOGITS, recoveries, nonfinite)


MATCH, WRONG = probe(), probe((1, 2, 4))
NAN_ONCE = probe(recoveries=1, nonfinite=1)  # the step ran again and gave the golden output
CUT = out_of_re_prefills()  # CCU exceptions used up its re-prefills
MIXED = out_of_re_prefills(nonfinite=1)  # CCU exceptions and one NaN/Inf
NAN_ALWAYS = out_of_re_prefills(nonfinite=4)  # NaN/Inf each time the step ran


class Script:
    """Probe runs in order (an exception is raised), each taking `seconds` of a modelled clock."""

    def __init__(self, *runs: ProbeOutcome | Exception | None, seconds: float = 1.0) -> None:
        self._runs: Iterator[ProbeOutcome | Exception | None] = iter(runs)
        self.seconds = seconds
        self.now = 0.0
        self.timeouts: list[float] = []

    def clock(self) -> float:
        return self.now

    def run(self, timeout: float) -> ProbeOutcome | None:
        self.timeouts.append(timeout)
        self.now += min(self.seconds, timeout)
        outcome = next(self._runs)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome


def check(script: Script) -> tuple[GoldenVerdict, list[AttemptResult]]:
    result = recheck(script.run, GOLDEN, TIMEOUT, "tiny@1", clock=script.clock)
    return result.verdict, [a.result for a in result.attempts]


def test_a_run_is_judged_on_its_output_whatever_faults_it_re_prefilled_past() -> None:
    assert judge(MATCH, GOLDEN, 1).result is AttemptResult.MATCH
    passed = judge(probe(recoveries=2), GOLDEN, 1)
    assert passed.result is AttemptResult.MATCH, "a CCU exception re-prefilled past is no mismatch"
    assert "re-prefilled past 2 device fault(s)" in passed.message
    once = judge(NAN_ONCE, GOLDEN, 1)
    assert once.result is AttemptResult.MATCH and "1 of them NaN/Inf" in once.message, "not repeated: weather"
    assert judge(WRONG, GOLDEN, 1).result is AttemptResult.MISMATCH
    wrong_top = ProbeOutcome(MATCH.final, MATCH.tokens, np.array([3.0, 0.5, 1.0, -2.0], dtype=np.float32))
    assert judge(wrong_top, GOLDEN, 1).result is AttemptResult.MISMATCH
    assert judge(NAN_ALWAYS, GOLDEN, 1).result is AttemptResult.MISMATCH, "the model's NaN/Inf repeats"
    assert judge(MIXED, GOLDEN, 1).result is AttemptResult.DISTURBED
    assert judge(CUT, GOLDEN, 1).result is AttemptResult.DISTURBED
    assert judge(None, GOLDEN, 1).result is AttemptResult.DISTURBED


@pytest.mark.parametrize(
    ("runs", "verdict", "made"),
    [
        ((MATCH,), GoldenVerdict.PASSED, 1),
        ((NAN_ONCE,), GoldenVerdict.PASSED, 1),
        ((CUT, MIXED, MATCH), GoldenVerdict.PASSED, 3),
        ((NAN_ALWAYS, MATCH), GoldenVerdict.PASSED, 2),  # not reproduced
        ((NAN_ALWAYS, NAN_ALWAYS), GoldenVerdict.FAILED, 2),
        ((WRONG, CUT, NAN_ALWAYS), GoldenVerdict.FAILED, 3),
        ((CUT,) * RECHECK_ATTEMPTS, GoldenVerdict.INCONCLUSIVE, RECHECK_ATTEMPTS),
        ((WRONG, CUT, MIXED, CUT), GoldenVerdict.INCONCLUSIVE, RECHECK_ATTEMPTS),
    ],
)
def test_the_recheck_fails_only_on_a_reproduced_mismatch_within_its_bound(
    runs: tuple[ProbeOutcome, ...], verdict: GoldenVerdict, made: int
) -> None:
    script = Script(*runs, *(MATCH,) * 3)  # a match past the bound must never be reached
    got, results = check(script)
    assert (got, len(results)) == (verdict, made), results
    assert REPRODUCE == 2 and len(script.timeouts) == made <= RECHECK_ATTEMPTS


def test_runs_share_the_time_limit_and_a_run_out_of_time_ends_the_recheck() -> None:
    script = Script(CUT, None, MATCH, seconds=70.0)  # the second run has the 50 s left and does not finish
    assert check(script) == (GoldenVerdict.INCONCLUSIVE, [AttemptResult.DISTURBED, AttemptResult.DISTURBED])
    assert script.timeouts == [TIMEOUT, TIMEOUT - 70.0]


def test_a_board_that_refuses_probes_ends_the_recheck_without_a_verdict() -> None:
    script = Script(CUT, Unavailable("device lost: board is not serving"), MATCH)
    result = recheck(script.run, GOLDEN, TIMEOUT, "tiny@1", clock=script.clock)
    assert result.verdict is GoldenVerdict.INCONCLUSIVE and len(result.attempts) == 2
    assert "the board refused the probe: device lost" in result.summary()
    with pytest.raises(InvalidArgument):  # anything else is no device weather: the caller decides
        recheck(Script(InvalidArgument("bad golden prompt")).run, GOLDEN, TIMEOUT, "tiny@1")
