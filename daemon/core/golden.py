"""The golden check: a package's golden prefill/decode run on the device and judged (docs/daemon.md,
"Escalations" and the non-finite logits row of "Resource bounds").

`judge` turns one probe run into an `Attempt`:

- MATCH: the golden tokens and top logits. A device fault the probe re-prefilled past (a CCU
  exception, or NaN/Inf logits that the same step, computed again, did not repeat) is no mismatch:
  the run is judged on what it produced.
- MISMATCH: the model's output differs from the golden one, or it gave NaN/Inf logits each time
  until the probe's re-prefills were used up (a model that computes NaN/Inf on these inputs does so
  every time).
- DISTURBED: a device fault kept the run from an answer (its re-prefills used up by CCU
  exceptions, the board refusing or stopping it, no answer in time): it says nothing of the model.

`recheck` is the re-check after a quarantine. It judges the model, not the weather:

- a DISTURBED run is run again, at most `RECHECK_ATTEMPTS` runs within the time limit;
- it fails only on a mismatch it reproduces: `REPRODUCE` mismatching runs before any match;
- runs that end without a verdict (every run disturbed, or one mismatch never reproduced) are
  INCONCLUSIVE: nothing shows the model is wrong, so it is not unloaded for it.

Owner: `ModelManager` (load, re-warm and the quarantine's re-check call these on their caller's thread).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

import numpy as np

from calculet.common.errors import ErrorKind, Unavailable
from calculet.daemon.core.engine_types import ProbeOutcome
from calculet.daemon.core.events import FinishReason
from calculet.daemon.core.request import GenerationRequest, StoppingParams
from calculet.daemon.package.manifest import GoldenDecl
from calculet.daemon.sampling.params import SamplingParams

log = logging.getLogger(__name__)

RECHECK_ATTEMPTS = 4  # probe runs a re-check may make (each disturbed run is retried within this)
REPRODUCE = 2  # mismatching runs that fail a re-check: one is not reproduced yet


class AttemptResult(Enum):
    MATCH = "match"
    MISMATCH = "mismatch"  # the model's output differs from the golden one
    DISTURBED = "disturbed"  # a device fault or the board kept the run from an answer


class GoldenVerdict(Enum):
    PASSED = "passed"
    FAILED = "failed"  # a mismatch reproduced
    INCONCLUSIVE = "inconclusive"  # device faults kept every run from a verdict, or a mismatch did not reproduce


@dataclass(frozen=True)
class Attempt:
    """One judged probe run: its result and what it saw, for the log and the audit."""

    result: AttemptResult
    message: str


@dataclass(frozen=True)
class RecheckResult:
    """How a re-check ended and every run it made, in order."""

    verdict: GoldenVerdict
    attempts: tuple[Attempt, ...]

    def summary(self) -> str:
        """What the re-check did, for the audit and the model's message: the one run's message when
        the first passed, else the verdict and every run (`golden check passed on run 2 of 4 (run 1:
        ...; run 2: ...)`)."""
        runs = len(self.attempts)
        if self.verdict is GoldenVerdict.PASSED and runs == 1:
            return self.attempts[0].message
        head = {
            GoldenVerdict.PASSED: f"golden check passed on run {runs} of {RECHECK_ATTEMPTS}",
            GoldenVerdict.FAILED: f"golden check failed: a mismatch reproduced in {runs} run(s)",
            GoldenVerdict.INCONCLUSIVE: f"golden check inconclusive after {runs} run(s): no mismatch reproduced",
        }[self.verdict]
        return f"{head} ({'; '.join(f'run {i}: {a.message}' for i, a in enumerate(self.attempts, 1))})"


def golden_request(alias: str, golden: GoldenDecl) -> GenerationRequest:
    """The golden prompt, decoded greedily for exactly the golden decode's length."""
    return GenerationRequest(
        model=alias,
        prompt_tokens=golden.prompt_tokens,
        sampling=SamplingParams(temperature=0.0),
        stopping=StoppingParams(max_tokens=len(golden.decode_tokens), ignore_eos=True),
    )


def judge(probe: ProbeOutcome | None, golden: GoldenDecl, timeout: float) -> Attempt:
    """Judge one probe run against the golden data (module docstring).

    Args:
        probe: the run; None when it did not finish within `timeout` seconds.

    Returns:
        The run's result and what it saw.
    """
    if probe is None:
        return Attempt(AttemptResult.DISTURBED, f"golden check did not finish within {timeout:g}s")
    final = probe.final
    if final.reason not in (FinishReason.LENGTH, FinishReason.STOP):
        # Out of re-prefills with NaN/Inf every time: the model's, not a device fault it happened to meet.
        if final.error_kind is ErrorKind.ABORTED and 0 < probe.nonfinite == probe.recoveries:
            return Attempt(
                AttemptResult.MISMATCH,
                f"non-finite logits each of the {probe.nonfinite} times it ran: {final.error_message}",
            )
        return Attempt(AttemptResult.DISTURBED, f"golden check failed: {final.error_message}")
    if probe.tokens != golden.decode_tokens:
        return Attempt(
            AttemptResult.MISMATCH,
            f"golden decode mismatch: expected {list(golden.decode_tokens)}, got {list(probe.tokens)}",
        )
    top = _top_logits_problem(probe.first_logits, golden.prefill_top, golden.logit_atol)
    if top is not None:
        return Attempt(AttemptResult.MISMATCH, top)
    past = ""
    if probe.recoveries:
        nan = f", {probe.nonfinite} of them NaN/Inf" if probe.nonfinite else ""
        past = f" (re-prefilled past {probe.recoveries} device fault(s){nan})"
    return Attempt(AttemptResult.MATCH, f"golden check passed{past}")


def recheck(
    run: Callable[[float], ProbeOutcome | None],
    golden: GoldenDecl,
    timeout: float,
    what: str,
    clock: Callable[[], float] = time.monotonic,
) -> RecheckResult:
    """The re-check after a quarantine (module docstring): runs until a match, a reproduced mismatch,
    `RECHECK_ATTEMPTS` runs or `timeout` seconds in all.

    Args:
        run: runs one probe, waiting up to the seconds given; None when it did not finish.
        timeout: seconds for every run together.
        what: the generation, for the log (`qwen@3`).

    Returns:
        The verdict and the runs it made (at least one).

    Raises:
        CalculetError: as `run`, except Unavailable (the board takes no work now: a disturbed run
            that ends the re-check, since running again cannot help).
    """
    attempts: list[Attempt] = []
    deadline = clock() + timeout
    while len(attempts) < RECHECK_ATTEMPTS:
        left = max(deadline - clock(), 0.0)
        try:
            attempt = judge(run(left), golden, left)
        except Unavailable as exc:  # a halted board runs nothing; its own escalation follows
            attempts.append(Attempt(AttemptResult.DISTURBED, f"the board refused the probe: {exc}"))
            break
        attempts.append(attempt)
        if attempt.result is AttemptResult.MATCH:
            return RecheckResult(GoldenVerdict.PASSED, tuple(attempts))
        if sum(a.result is AttemptResult.MISMATCH for a in attempts) >= REPRODUCE:
            return RecheckResult(GoldenVerdict.FAILED, tuple(attempts))
        if deadline <= clock():
            break
        log.warning(
            "golden re-check of %s, run %d of %d: %s: running it again", what, len(attempts), RECHECK_ATTEMPTS,
            attempt.message,
        )  # fmt: skip
    return RecheckResult(GoldenVerdict.INCONCLUSIVE, tuple(attempts))


def _top_logits_problem(logits: np.ndarray | None, expected: tuple[tuple[int, float], ...], atol: float) -> str | None:
    """Why the first step's top logits differ from the golden ones; None when they match."""
    if logits is None:
        return "golden check: prefill logits were not captured"
    order = np.lexsort((np.arange(logits.size), -logits))[: len(expected)]
    got = [(int(i), float(logits[i])) for i in order]
    for (etok, eval_), (gtok, gval) in zip(expected, got, strict=True):
        if etok != gtok or abs(eval_ - gval) > atol:
            return f"golden prefill mismatch: expected top {list(expected)}, got {got}"
    return None
