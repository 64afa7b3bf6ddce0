"""When the supervisor starts a worker again after it exited on its own, and when it gives up.

A worker that exits while the gateway is not stopping is restarted after a delay that doubles with
each exit (0.5 s, 1 s, 2 s ... up to 10 s), so a crash loop costs little CPU and fills the log
slowly. The delay starts over once a worker has served (been ready) for `stable_s`. A worker that
dies before it was ever ready `start_failures` times in a row means every start fails (a board
configuration or a file that the first start read no longer works, a bug at start-up): restarting
cannot help, so the supervisor stops the whole gateway with a failure (systemd then applies its
own restart rule). Pure logic: the caller measures the times.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RestartPolicy:
    """Attributes:
    first_delay_s: the delay before the first restart, and after a stable run.
    max_delay_s: the longest delay.
    stable_s: served this long (from ready) -> the next delay is `first_delay_s` again.
    start_failures: exits before ready in a row that give up.
    """

    first_delay_s: float = 0.5
    max_delay_s: float = 10.0
    stable_s: float = 30.0
    start_failures: int = 5


class RestartBackoff:
    """The restart history of one worker slot (its index), across the processes that filled it.

    Args:
        policy: the delays and the limit.
    """

    def __init__(self, policy: RestartPolicy) -> None:
        self.policy = policy
        self._next_delay_s = policy.first_delay_s
        self.failed_starts = 0  # exits before ready, in a row

    def exited(self, ready_for_s: float | None) -> float | None:
        """The worker exited on its own.

        Args:
            ready_for_s: how long it served after it was ready; None if it never was.
        Returns:
            Seconds to wait before starting it again, or None: give up (too many failed starts).
        """
        if ready_for_s is None:
            self.failed_starts += 1
            if self.failed_starts >= self.policy.start_failures:
                return None
        else:
            self.failed_starts = 0
            if ready_for_s >= self.policy.stable_s:
                self._next_delay_s = self.policy.first_delay_s
        delay = self._next_delay_s
        self._next_delay_s = min(self.policy.max_delay_s, delay * 2)
        return delay
