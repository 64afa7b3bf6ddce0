"""When jobs run out of time before a device job carries them: their deadline passed while they held
a lane between steps, nobody has followed them with a Wait stream for `orphan_timeout_s`, and when
the engine thread must wake next to look again (the admission queue's own timeouts are the
scheduler's, `Scheduler.expire` and `next_deadline`).

Pure: reads the scheduler's sets and the live jobs under the engine lock and returns what is due;
the engine's bookkeeping ends those jobs (`Bookkeeper.expire`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from calculet.daemon.core.client_job import ClientJob
from calculet.daemon.core.scheduler import Scheduler


def past_deadline(scheduler: Scheduler, now: float) -> list[ClientJob]:
    """Jobs holding a lane between device jobs (ready, or part-way through a chunked prefill) whose
    deadline passed."""
    holding = [*scheduler.ready.values(), *scheduler.partial]
    return [s for s in holding if s.deadline is not None and s.deadline <= now]


def clients(jobs: Iterable[ClientJob]) -> list[ClientJob]:
    """Client jobs (not warm-up probes) not already being cancelled: those an orphan timeout ends."""
    return [s for s in jobs if not s.internal and not s.cancel_requested]


def next_wakeup(scheduler: Scheduler, jobs: Iterable[ClientJob], orphan_timeout_s: float | None) -> float | None:
    """Seconds until the next queue timeout, deadline or orphan check is due (None: none)."""
    times = [t for t in [scheduler.next_deadline()] if t is not None]
    holding = [*scheduler.ready.values(), *scheduler.partial]
    times += [s.deadline for s in holding if s.deadline is not None]
    watched = clients(jobs)
    if orphan_timeout_s is not None and watched:
        # A reader detaching does not wake the engine thread, so look again within one timeout: an
        # orphan is cancelled between one and two timeouts after its last Wait went away.
        now = time.monotonic()
        times += [now + orphan_timeout_s - s.log.detached_for(now) for s in watched]
    return max(0.0, min(times) - time.monotonic()) if times else None
