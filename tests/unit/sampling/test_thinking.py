"""The thinking tracker on its own (docs/daemon.md "Thinking budget"): which block it budgets (open
at the prompt's end, or opened by the first token only), when it forces the close, what a resume
replays (and refuses), and the domain type's checks."""

from __future__ import annotations

import pytest

from calculet.common.errors import IllegalTransition, InvalidArgument
from calculet.daemon.sampling.thinking import ThinkingBudget, ThinkingTracker, ThinkPhase

OPEN, CLOSE = 10, 11


def tracker(budget: int, prompt: tuple[int, ...]) -> ThinkingTracker:
    return ThinkingTracker(ThinkingBudget(budget, OPEN, CLOSE), prompt, "job-t")


@pytest.mark.parametrize(
    ("prompt", "phase"),
    [
        ((1, 2, OPEN), ThinkPhase.THINKING),
        ((1, OPEN, 5, 6), ThinkPhase.THINKING),  # open, thinking already under way in the prompt
        ((OPEN, 5, CLOSE, 7), ThinkPhase.PENDING),  # the last marker closes
        ((CLOSE, OPEN), ThinkPhase.THINKING),
        ((1, 2, 3), ThinkPhase.PENDING),
    ],
)
def test_the_prompts_last_marker_decides_the_start(prompt: tuple[int, ...], phase: ThinkPhase) -> None:
    assert tracker(3, prompt).phase is phase


def test_the_close_is_forced_after_exactly_n_thinking_tokens() -> None:
    t = tracker(3, (1, OPEN))
    for token in (5, 6, 7):
        assert t.forced_next() is None and not t.is_answer(token)
        t.observe(token)
    assert t.forced_next() == CLOSE and not t.is_answer(CLOSE)
    t.observe(CLOSE)
    assert t.phase is ThinkPhase.ANSWER and t.forced_next() is None and t.is_answer(OPEN)
    t.observe(OPEN)  # a later open token opens nothing
    assert t.phase is ThinkPhase.ANSWER and t.forced_next() is None


def test_budget_zero_forces_at_once_and_a_drawn_close_is_not_forced_again() -> None:
    assert tracker(0, (OPEN,)).forced_next() == CLOSE
    t = tracker(5, (OPEN,))
    t.observe(CLOSE)
    for token in range(20):
        assert t.forced_next() is None
        t.observe(token)


def test_only_the_first_token_may_open_a_block() -> None:
    t = tracker(1, (1,))
    assert t.is_answer(5) and not t.is_answer(OPEN)
    t.observe(OPEN)
    assert t.phase is ThinkPhase.THINKING and t.count == 0
    t.observe(5)
    assert t.forced_next() == CLOSE
    late = tracker(1, (1,))
    late.observe(5)
    late.observe(OPEN)
    assert late.phase is ThinkPhase.ANSWER and late.forced_next() is None


@pytest.mark.parametrize(
    ("prompt", "resume", "first_answer"),
    [
        ((OPEN,), (5, 6, CLOSE, 8, 9), 3),
        ((OPEN,), (5, 6), 2),
        ((1,), (OPEN, 5, CLOSE, 8), 3),
        ((1,), (8, OPEN, 9), 0),
        ((1,), (), 0),
    ],
)
def test_replay_returns_the_first_answer_token(
    prompt: tuple[int, ...], resume: tuple[int, ...], first_answer: int
) -> None:
    assert tracker(2, prompt).replay(resume) == first_answer


def test_a_resume_without_the_forced_close_is_refused() -> None:
    with pytest.raises(InvalidArgument, match=r"^resume_tokens\[2\]: the thinking budget forces the close token 11"):
        tracker(2, (OPEN,)).replay((5, 6, 7))


def test_the_phase_lifecycle_has_no_way_back() -> None:
    t = tracker(1, (1,))
    t.observe(5)
    with pytest.raises(IllegalTransition):
        t.lifecycle.move(ThinkPhase.THINKING)


@pytest.mark.parametrize(
    ("args", "field"),
    [
        ((-1, OPEN, CLOSE), "thinking.budget"),
        ((2**31, OPEN, CLOSE), "thinking.budget"),
        ((1.5, OPEN, CLOSE), "thinking.budget"),
        ((1, -1, CLOSE), "thinking.open_token_id"),
        ((1, OPEN, OPEN), "thinking.close_token_id"),
    ],
)
def test_bad_fields_are_refused_naming_them(args: tuple[object, object, object], field: str) -> None:
    with pytest.raises(InvalidArgument, match=f"^{field}: "):
        ThinkingBudget(*args)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match=r"^thinking\.close_token_id: token id 11 outside"):
        ThinkingBudget(1, OPEN, CLOSE).validate(11)
