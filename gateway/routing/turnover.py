"""`Turnover`: how long this gateway's choices hold a lane, per model (the lane-wait scorer's input).

An exponentially weighted moving average of completed choices' durations (from the pick that
placed the choice on its board to its end there), per alias. Before the first observation it is
`DEFAULT_TURNOVER_MS`. Plain arithmetic on the numbers it is given: the caller measures.
"""

from __future__ import annotations

DEFAULT_TURNOVER_MS = 10_000.0
TURNOVER_WEIGHT = 0.2
"""Weight of the newest observation in the average."""


class Turnover:
    """Per-alias EWMA of choice durations, in milliseconds.

    Args:
        default_ms: the value before any observation.
        weight: the newest observation's weight (0 < weight <= 1).
    """

    def __init__(self, default_ms: float = DEFAULT_TURNOVER_MS, weight: float = TURNOVER_WEIGHT) -> None:
        self._default_ms = default_ms
        self._weight = weight
        self._ms: dict[str, float] = {}

    def observe(self, alias: str, seconds: float) -> None:
        """One choice of `alias` held its lane for `seconds`.

        Args:
            alias: the model.
            seconds: the duration (negative values count as 0).
        """
        ms = max(0.0, seconds) * 1000.0
        old = self._ms.get(alias)
        self._ms[alias] = ms if old is None else old + self._weight * (ms - old)

    def ms(self, alias: str) -> float:
        """The average for `alias` in milliseconds (the default before any observation)."""
        return self._ms.get(alias, self._default_ms)
