"""Thinking budgets through a real daemon process over gRPC (docs/daemon.md "Thinking budget"): the
close is forced after N thinking tokens and streamed with logprob 0.0; a Submit resumed with the
tokens up to and past the forced close continues as the undisturbed run did; a thinking budget with
a constraint answers in the constraint after the close; bad budgets are INVALID_ARGUMENT naming the
field and the board still serves afterwards. The tiny tokenizer has no think tokens: plain ids stand
for them."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer

from calculet.client import (
    Constraint,
    DaemonClient,
    FinalEvent,
    FinishReason,
    InvalidArgument,
    SamplingParams,
    ThinkingBudget,
    TokenChunk,
)

pytestmark = pytest.mark.integration

OPEN, CLOSE = 300, 301
PROMPT = (5, 6, 7, OPEN)  # the generation prompt opened the block
N = 5


def _run(c: DaemonClient, sampling: SamplingParams, max_tokens: int, resume: tuple[int, ...] = ()):  # type: ignore[no-untyped-def]
    job = c.submit("tiny", PROMPT, sampling=sampling, max_tokens=max_tokens, resume_tokens=resume).job_id
    events = list(c.wait(job))
    final = events[-1]
    assert isinstance(final, FinalEvent)
    chunks = [e for e in events if isinstance(e, TokenChunk)]
    return [t for e in chunks for t in e.tokens], [lp for e in chunks for lp in e.logprobs], final


def test_a_budget_forces_the_close_resumes_equal_and_bad_budgets_are_refused(start_daemon) -> None:
    daemon = start_daemon("--model", "tiny=tiny")
    with DaemonClient(daemon.target) as c:
        budget = ThinkingBudget(N, open_token_id=OPEN, close_token_id=CLOSE)
        sampling = SamplingParams(seed=7, temperature=1.0, logprobs=0, thinking=budget)
        tokens, logprobs, final = _run(c, sampling, 20)
        assert final.reason is FinishReason.LENGTH and len(tokens) == 20
        assert tokens[N] == CLOSE and CLOSE not in tokens[:N]
        assert logprobs[N].logprob == 0.0 and all(lp.logprob < 0.0 for i, lp in enumerate(logprobs) if i != N)
        for k in (N, N + 1, N + 3):  # resumed before, just after and past the forced close
            rest, _, again = _run(c, sampling, 20, tuple(tokens[:k]))
            assert tokens[:k] + rest == tokens and again.reason is FinishReason.LENGTH

        tok = Tokenizer.from_str(c.get_model("tiny").tokenizer_json.decode())
        constrained = SamplingParams(
            seed=3, temperature=1.0, thinking=budget, constraint=Constraint.of_regex("[a-f]{3,8}")
        )
        job = c.submit("tiny", PROMPT, sampling=constrained, max_tokens=40).job_id
        events = list(c.wait(job))
        answer = [t for e in events if isinstance(e, TokenChunk) for t in e.tokens]
        assert isinstance(events[-1], FinalEvent) and events[-1].reason is FinishReason.STOP
        assert answer[N] == CLOSE and len(tok.decode(answer[N + 1 :])) >= 3
        assert set(tok.decode(answer[N + 1 :])) <= set("abcdef")

        for bad, field in (
            (ThinkingBudget(4, OPEN, OPEN), r"thinking\.close_token_id"),
            (ThinkingBudget(4, OPEN, 10**6), r"thinking\.close_token_id"),
            (ThinkingBudget(2**31, OPEN, CLOSE), r"thinking\.budget"),
        ):
            with pytest.raises(InvalidArgument, match=field):
                c.submit("tiny", PROMPT, sampling=SamplingParams(seed=1, thinking=bad), max_tokens=10)
        counters = c.status().job_counters  # the refusals queued nothing
        assert (counters.accepted, counters.rejected, counters.completed) == (5, 3, 5)
        assert c.status().inflight_submissions == 0
        tokens, _, final = _run(c, SamplingParams(seed=2, thinking=ThinkingBudget(0, OPEN, CLOSE)), 5)
        assert tokens[0] == CLOSE and final.reason is FinishReason.LENGTH
