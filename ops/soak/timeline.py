"""`Timeline`: seconds since the soak phase started, on the monotonic clock.

Everything the soak records (requests, samples, faults, restarts) is stamped with `now()`; before
`start()` (package builds, references, calibration) readings are relative to the timeline's
creation and `start()` moves the origin. The clock is injectable for tests.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class Timeline:
    """A movable origin on a monotonic clock."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.origin = clock()

    def start(self) -> None:
        """Make now the origin (the soak phase starts)."""
        self.origin = self.clock()

    def now(self) -> float:
        """Seconds since the origin."""
        return self.clock() - self.origin
