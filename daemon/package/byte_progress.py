"""Byte progress of one long read (hashing a package's files), throttled before it reaches anyone.

This module owns the throttle and nothing else. Data flows: the reader (`files.FileChecker`) calls
`start(total)` once, `update(done)` as bytes are read (cumulative, any number of times) and
`finish()` at the end -> `ByteThrottle` passes `(done, total)` on to its sink: the first `(0, total)`,
then at most one report per `step` of the total *and* per `interval_s` seconds (whichever comes
later), then the final `(total, total)`. So a 30 GB package sends about a hundred reports, not one
per chunk. The clock is injectable: tests drive the rules with a clock they control, never with
the machine's speed. A total of 0 (nothing to read) reports nothing.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

BytesFn = Callable[[int, int], None]
"""on_bytes(done, total): bytes processed so far and in all; done rises monotonically to total."""

STEP = 0.01  # report at most once per 1 % of the total...
INTERVAL_S = 0.25  # ...and at most once per 0.25 s, whichever comes later


class ByteThrottle:
    """Forwards cumulative byte counts to `sink`, throttled.

    Args:
        sink: receives `(done, total)`.
        step: least fraction of the total between two reports (0 < step <= 1).
        interval_s: least clock seconds between two reports (>= 0).
        clock: monotonic seconds (default `time.monotonic`).

    Raises:
        ValueError: step or interval_s out of range.
    """

    def __init__(
        self,
        sink: BytesFn,
        *,
        step: float = STEP,
        interval_s: float = INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not 0 < step <= 1:
            raise ValueError(f"step: must be in (0, 1], got {step}")
        if not interval_s >= 0:
            raise ValueError(f"interval_s: must be >= 0, got {interval_s}")
        self._sink = sink
        self._step = step
        self._interval_s = interval_s
        self._clock = clock
        self.total = 0
        self._least = 1  # bytes between two reports
        self._done = 0  # last reported
        self._at = 0.0  # clock of the last report

    def start(self, total: int) -> None:
        """Begin a read of `total` bytes: reports `(0, total)` unless total is 0.

        Raises:
            ValueError: total is negative.
        """
        if total < 0:
            raise ValueError(f"total: must be >= 0, got {total}")
        self.total = total
        self._least = max(1, math.ceil(total * self._step))
        self._done = 0
        if total:
            self._emit(0)

    def update(self, done: int) -> None:
        """`done` bytes of the total are processed (clamped to the total; a lower value than the
        last report is ignored). Reports it when both throttle rules allow, or when it is the total."""
        done = min(done, self.total)
        if done <= self._done:
            return
        if done == self.total:
            self._emit(done)
            return
        if done - self._done < self._least:
            return
        now = self._clock()
        if now - self._at >= self._interval_s:
            self._emit(done, now)

    def finish(self) -> None:
        """The read is over: reports `(total, total)` if it was not the last report."""
        if self.total and self._done < self.total:
            self._emit(self.total)

    def _emit(self, done: int, now: float | None = None) -> None:
        self._done = done
        self._at = self._clock() if now is None else now
        self._sink(done, self.total)
