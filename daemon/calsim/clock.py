"""The modelled device clock and the pacer that maps it to wall time.

Data flow: at submit, `DeviceClock.place` puts a job's phases on the device timeline from its
durations (`timing.py`); the worker performs each step when `Pacer.delay` says its device time
is due on the wall clock; `observe` and `settle_reset` move the host's position on the timeline.
Nothing here depends on wall time except `Pacer`, so timestamps are identical whatever
`time_scale` is.

Model (seconds, starting at 0 when the device opens):
- `host_now` is the latest device time the host is known to have reached. It advances when
  `Submission.wait` returns (to that job's `d2h_end`), when a reset happens, and when a job is
  queued on a bank that finished later than `host_now` (the host saw the bank free). It never
  follows the wall clock, so a submit/wait sequence always yields the same times.
- queued = max(host_now, end of the bank's previous job); H2D starts at
  max(queued + slow-job delay, end of the previous H2D) (one host-to-device copy path, FIFO);
  compute starts at max(H2D end, end of the previous compute) (one compute unit, FIFO);
  D2H starts right after compute (device-to-host copies run on their own path, so one job's
  copies overlap the other bank's compute). A hung job's compute never ends (`inf`), and every
  later compute waits behind it (`inf`) until a reset.
- A reset at r = max(host_now, compute start of every hung job it aborts) cuts the aborted jobs'
  times at r; survivors keep their times, except computes stuck behind a hang (`inf`), which are
  re-planned from max(their H2D end, r).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

from calculet.daemon.calsim.job import Job, Schedule
from calculet.daemon.calsim.timing import JobDurations
from calculet.daemon.device.types import EngineSlot


class DeviceClock:
    """Resource availability on the modelled timeline. Not thread-safe: used under the device lock."""

    def __init__(self) -> None:
        self.host_now = 0.0
        self.h2d_free = 0.0
        self.compute_free = 0.0
        self.bank_free: dict[EngineSlot, float] = {EngineSlot.PING: 0.0, EngineSlot.PONG: 0.0}

    def queue_time(self, bank: EngineSlot) -> float:
        return max(self.host_now, self.bank_free[bank])

    def place(self, bank: EngineSlot, durations: JobDurations, delay_s: float, hang: bool) -> Schedule:
        """Schedule a job accepted now on `bank`; reserves the copy path and compute unit."""
        queued = self.queue_time(bank)
        self.host_now = queued
        h2d_start = max(queued + delay_s, self.h2d_free)
        h2d_end = h2d_start + durations.h2d
        compute_start = max(h2d_end, self.compute_free)
        compute_end = math.inf if hang else compute_start + durations.compute
        d2h_end = compute_end + durations.d2h
        self.h2d_free = h2d_end
        self.compute_free = compute_end
        return Schedule(queued, h2d_start, h2d_end, compute_start, compute_end, compute_end, d2h_end)

    def observe(self, device_time: float) -> None:
        """The host has seen the device reach `device_time` (a completed wait)."""
        if math.isfinite(device_time):
            self.host_now = max(self.host_now, device_time)

    def release_bank(self, bank: EngineSlot, at: float) -> None:
        """The job on `bank` finished; the bank is free from device time `at` (its D2H end) on."""
        self.bank_free[bank] = at

    def reset_time(self, aborted: Sequence[Job]) -> float:
        hung = [j.schedule.compute_start for j in aborted if j.hangs and math.isfinite(j.schedule.compute_start)]
        return max([self.host_now, *hung])

    def settle_reset(self, aborted: Sequence[Job], survivors: Sequence[Job], r: float) -> None:
        """Apply a reset at device time `r`: cut `aborted` at r, re-plan survivors stuck behind a
        hang, and free the copy path and compute unit accordingly."""
        self.host_now = max(self.host_now, r)
        for job in aborted:
            job.schedule.clamp(r)
        self.h2d_free = max([min(self.h2d_free, r), *(s.schedule.h2d_end for s in survivors)])
        compute_free = min(self.compute_free, r)
        for s in sorted(survivors, key=lambda j: j.job_id):
            sched = s.schedule
            if math.isinf(sched.compute_start):
                sched.compute_start = max(sched.h2d_end, compute_free)
                sched.compute_end = math.inf if s.hangs else sched.compute_start + s.durations.compute
                sched.d2h_start = sched.compute_end
                sched.d2h_end = sched.compute_end + s.durations.d2h
            compute_free = max(compute_free, sched.compute_end)
        self.compute_free = compute_free


class Pacer:
    """Maps device time to wall time: device time `t` is due at `wall0 + (t - dev0) * time_scale`.

    The anchor (wall0, dev0) is set whenever the device goes from idle to busy, so idle host
    time is never "caught up". With time_scale 0 everything is due at once.

    Args:
        time_scale: wall seconds per modelled second (>= 0).
        clock: monotonic wall clock (injectable for tests).
    """

    def __init__(self, time_scale: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.time_scale = time_scale
        self._clock = clock
        self._wall0 = clock()
        self._dev0 = 0.0

    def anchor(self, device_time: float) -> None:
        self._wall0 = self._clock()
        self._dev0 = device_time

    def delay(self, device_time: float) -> float:
        """Wall seconds until `device_time` is due (<= 0: due now)."""
        if self.time_scale == 0:
            return 0.0
        due = self._wall0 + (device_time - self._dev0) * self.time_scale
        return due - self._clock()
