"""The load's offset check: the golden prompt run three ways must agree before a generation prefills
at an offset (docs/daemon.md, "Prefill at an offset"; `prefill_offset.py` decides what follows).

Where the package declares `prefill_at_offset`, the golden check's run (the golden prompt whole, at
offset 0, its lane parked when it ends: `ProbeShape.park`) is followed by two more runs of the same
greedy request:

1. **continued**: it takes the lane the whole run parked, truncated to the first `split` tokens
   (a tail deletion, as prefix reuse makes; `ProbeShape.keep`), and prefills the rest at offset
   `split`, over KV another job wrote and past KV it must ignore;
2. **chunked**: on a cold lane, the prompt in two prefill jobs, `[0, split)` then `[split, n)` at
   offset `split` (`ProbeShape.chunk`), as chunked prefill runs a long prompt.

`split` is half the prompt, rounded up. They run in this order so that a one-lane model can run
them all: the continued run needs the lane the whole run parked, the chunked one any lane after.
The continued run decodes 2 greedy tokens: the first from the offset prefill's logits, the second
from a decode step that reads the KV the offset prefill wrote; the chunked run only the first (its
second chunk is the same kind of write). Each must give the whole run's
first-step logits bit for bit (the kernels are exact, and docs/sources.md 000 §5.3 asks for the
incremental semantics, not an approximation of them) and its first tokens. Anything else, including
a run that fails or does not finish, leaves the offset unproven. A run a device fault made
re-prefill from scratch (a recovery) proved nothing about the offset: it runs once more.
Cost: 4 device jobs beside the golden check's; measured on calsim (time scale 0): 7 ms of host CPU
per load on the qwen preset (synthetic kernel), 12 ms on tiny (numeric kernel), and 0.2-0.3 s of
modelled device time.

Owner: `ModelManager` (on its load thread, through `Engine.probe`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from calculet.daemon.core.client_job import ProbeShape
from calculet.daemon.core.engine_types import ProbeOutcome
from calculet.daemon.core.events import FinishReason
from calculet.daemon.core.golden import golden_request
from calculet.daemon.core.prefill_offset import OffsetVerdict
from calculet.daemon.core.request import GenerationRequest
from calculet.daemon.package.manifest import GoldenDecl

CONTINUED_TOKENS = 2
"""Tokens the continued run decodes: the offset prefill's, then one decode step over the KV it wrote."""
PROBE_ATTEMPTS = 2
"""Runs of one shape while device faults keep making it re-prefill from scratch."""
PROBE_JOBS = CONTINUED_TOKENS + 2
"""Device jobs of an undisturbed offset check: the continued run's prefill and decode step, and the
chunked run's two prefills (fault plans that count device jobs count these too)."""

ProbeRun = Callable[[ProbeShape, int], ProbeOutcome | None]
"""Runs `offset_request` for that many tokens once in the given shape; None when it did not finish."""


def offset_request(alias: str, golden: GoldenDecl, tokens: int) -> GenerationRequest:
    """The golden prompt, decoded greedily for `tokens` tokens (at most the golden decode's)."""
    request = golden_request(alias, golden)
    stopping = dataclasses.replace(request.stopping, max_tokens=min(tokens, request.stopping.max_tokens))
    return dataclasses.replace(request, stopping=stopping)


def split_point(prompt_tokens: int) -> int:
    """Where the chunked run splits a prompt of this many tokens (and the continued run truncates):
    half, rounded up, so two chunks of at most `split` tokens cover it."""
    return (prompt_tokens + 1) // 2


def difference(whole: ProbeOutcome, other: ProbeOutcome | None, what: str) -> str | None:
    """Why `other` (the `what` run) differs from the whole run; None when it gives the same first
    logits, bit for bit, and the same tokens."""
    if other is None:
        return f"the {what} run did not finish"
    final = other.final
    if final.reason not in (FinishReason.LENGTH, FinishReason.STOP):
        return f"the {what} run failed: {final.error_message or final.reason.value}"
    if other.recoveries:
        return f"device faults made the {what} run re-prefill from scratch {PROBE_ATTEMPTS} times"
    a, b = whole.first_logits, other.first_logits
    if a is None or b is None:
        return f"the {what} run's first logits were not captured"
    if a.shape != b.shape or not np.array_equal(a, b):
        gap = float(np.max(np.abs(a - b))) if a.shape == b.shape else float("inf")
        return f"the {what} run's first logits differ from the whole run's (largest difference {gap:.4g})"
    expected = whole.tokens[: len(other.tokens)] if other.tokens else whole.tokens
    if not other.tokens or other.tokens != expected:
        return f"the {what} run decoded {list(other.tokens)}, the whole run {list(whole.tokens)}"
    return None


def _attempt(run: ProbeRun, shape: ProbeShape, tokens: int, again: ProbeShape | None = None) -> ProbeOutcome | None:
    """One run of `shape`, run again (up to `PROBE_ATTEMPTS`) while a device fault made it re-prefill
    from scratch, which bypasses the offset it was to prove. `again`: a run to make before each
    retry (the continued run needs a parked lane again: a whole run that parks one)."""
    outcome = run(shape, tokens)
    for _ in range(PROBE_ATTEMPTS - 1):
        if outcome is None or not outcome.recoveries:
            break
        if again is not None:
            run(again, 1)
        outcome = run(shape, tokens)
    return outcome


def prove_offset(run: ProbeRun, whole: ProbeOutcome, prompt_tokens: int) -> tuple[OffsetVerdict, str]:
    """Run the continued and chunked probes and judge them against the whole run (module docstring).

    Args:
        run: runs the golden request in a shape (`Engine.probe`).
        whole: the golden check's run, which parked its lane.
        prompt_tokens: the golden prompt's length.

    Returns:
        PROVEN, or REFUTED, with what the runs showed.

    Raises:
        CalculetError: as `run` (the board refused a probe).
    """
    if prompt_tokens < 2:
        return OffsetVerdict.REFUTED, f"the golden prompt ({prompt_tokens} token) is too short to split"
    split = split_point(prompt_tokens)
    continued = _attempt(run, ProbeShape(keep=split), CONTINUED_TOKENS, ProbeShape(chunk=prompt_tokens, park=True))
    problem = difference(whole, continued, "continued")
    if problem is None and continued is not None and continued.cached_tokens != split:
        problem = f"the continued run kept {continued.cached_tokens} KV tokens of the parked lane, not {split}"
    if problem is None:
        problem = difference(whole, _attempt(run, ProbeShape(chunk=split), 1), "chunked")
    if problem is not None:
        return OffsetVerdict.REFUTED, problem
    return OffsetVerdict.PROVEN, (
        f"the golden prompt whole, continued after {split} of {prompt_tokens} tokens, and in two chunks "
        "gave identical logits and tokens"
    )
