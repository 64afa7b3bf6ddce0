"""A sliding-window budget for automatic device resets (DESIGN.md section 3, reset controller).

Automatic resets (a hung job) are allowed `limit` times per `window_s`; past that the board stops
resetting itself, reports NOT_SERVING and waits for an operator, so a broken board cannot reset
in a storm. Operator resets (the Reset RPC) are not limited. Callers hold the engine lock.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from calculet.daemon.errors import InvalidArgument


@dataclass(frozen=True)
class BudgetView:
    used: int
    limit: int
    window_s: float
    exhausted: bool


class ResetBudget:
    """At most `limit` automatic resets in any `window_s` seconds.

    Raises (on construction):
        InvalidArgument: limit < 0 or window_s <= 0.
    """

    def __init__(self, limit: int = 3, window_s: float = 600.0, clock: Callable[[], float] = time.monotonic):
        if limit < 0 or window_s <= 0:
            raise InvalidArgument(f"reset budget: limit >= 0 and window > 0 required, got {limit}/{window_s}")
        self.limit = limit
        self.window_s = window_s
        self._clock = clock
        self._times: deque[float] = deque()
        self.exhausted = False

    def try_spend(self) -> bool:
        """Record one automatic reset if the budget allows it; otherwise mark it exhausted."""
        self._forget_old()
        if len(self._times) >= self.limit:
            self.exhausted = True
            return False
        self._times.append(self._clock())
        return True

    def view(self) -> BudgetView:
        self._forget_old()
        return BudgetView(len(self._times), self.limit, self.window_s, self.exhausted)

    def _forget_old(self) -> None:
        horizon = self._clock() - self.window_s
        while self._times and self._times[0] <= horizon:
            self._times.popleft()
