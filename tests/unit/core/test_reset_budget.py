"""The automatic reset budget: N per sliding window, then the board waits for an operator."""

from __future__ import annotations

import pytest

from calculet.common.errors import InvalidArgument
from calculet.daemon.core.resets.budget import ResetBudget


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_budget_allows_limit_per_window_then_refuses_and_recovers_as_the_window_slides() -> None:
    clock = Clock()
    budget = ResetBudget(limit=2, window_s=10.0, clock=clock)
    assert budget.try_spend() and budget.try_spend()
    assert not budget.try_spend()
    assert budget.view().exhausted and budget.view().used == 2
    clock.now = 10.5  # both resets left the window
    assert budget.view().used == 0
    assert budget.try_spend(), "the window slides: old resets stop counting"


@pytest.mark.parametrize(("limit", "window"), [(-1, 10.0), (1, 0.0)])
def test_bad_budget_is_invalid(limit: int, window: float) -> None:
    with pytest.raises(InvalidArgument):
        ResetBudget(limit, window)
