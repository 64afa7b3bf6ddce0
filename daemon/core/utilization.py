"""Device utilisation from the device's own job timestamps (docs/metrics.md): the busy ratio per
engine bank and in total, phase seconds and generated tokens, since the first job and over the last
few seconds. Status reports it (`UtilizationView`); the metrics export it.

Definitions (seconds on the DEVICE clock unless said otherwise; each finished device job contributes
once, with its `JobTimestamps`):

- device_seconds: the device clock's span from the first job's queue time to the latest job end (D2H
  end) seen. A real board's clock runs with wall time, so idle time counts as not busy. calsim's clock
  advances only by modelled work: it stops while the host submits nothing, so on calsim the ratios say
  how busy the compute unit is *while the board has work* (copies the pipeline does not hide count as
  idle; host think time and idle time do not). Idle boards show in `tokens_per_second` instead.
- busy_seconds: the union of the jobs' compute intervals [compute_start, compute_end]. There is one
  compute unit, so they do not overlap and this equals the compute seconds; the union is taken all
  the same, so a driver reporting overlapping intervals cannot push the ratio above 1.
- per bank: compute seconds of that bank's jobs over device_seconds; the banks' ratios add up to the
  total (ping/pong overlap hides copies, it never runs two computes at once).
- h2d / compute / d2h seconds: each job's phase durations, summed (the banks' copies overlap the other
  bank's compute, so these may add up to more than device_seconds).
- sampling_seconds: HOST seconds (perf_counter) the completion thread spent sampling logits;
  sampled_rows: the rows it sampled; d2h_bytes: what the device copied back for them (their outputs'
  active rows, plus the full rows read on demand from top-k jobs, `full_row_reads`).
- d2d_seconds / d2d_bytes: the jobs' cross-chip (D2D) traffic as the device counts it, summed: the
  part of their compute seconds spent on the chip link, and the bytes it moved (0 on a device or a
  package that does not count it: docs/package.md `topology.d2d`).
- generated_tokens: tokens streamed to client jobs (warm-up probes excluded).
- recent: the last RECENT_WINDOW_S seconds of WALL clock, in one-second buckets (the window covers
  between RECENT_WINDOW_S and RECENT_WINDOW_S + 1 seconds, less right after start):
  tokens_per_second = tokens / wall seconds; recent_busy_ratio = busy seconds / device seconds added in
  the window (0 when none were; at most 1, as a window can hold a compute whose copies were counted in
  the window before).

A job whose timestamps are missing or not finite (a driver that could not say) is left out.

Ownership: the engine, under its lock. `record` is O(1), `view` O(window); neither calls the device.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from calculet.daemon.core.observe.status import BankUtilizationView, UtilizationView
from calculet.daemon.device.types import EngineSlot, JobTimestamps

RECENT_WINDOW_S = 10.0


@dataclass
class _Bucket:
    """What one wall-clock second added."""

    second: int
    busy: float = 0.0
    device: float = 0.0
    tokens: int = 0


@dataclass(frozen=True)
class JobCopies:
    """What one sampled job copied: D2H bytes, rows sampled, full rows read on demand."""

    d2h_bytes: int = 0
    rows: int = 0
    full_row_reads: int = 0

    def plus(self, other: JobCopies) -> JobCopies:
        return JobCopies(
            self.d2h_bytes + other.d2h_bytes, self.rows + other.rows, self.full_row_reads + other.full_row_reads
        )


class UtilizationTracker:
    """Accumulates finished device jobs' timestamps into the figures of the module docstring.

    Args:
        banks: the device's engine banks, in order (each is reported, with zeros until it runs a job).
        started: monotonic wall time the tracking starts (the recent window never reaches before it).
        window_s: the recent window, wall seconds.
    """

    def __init__(self, banks: tuple[EngineSlot, ...], started: float, window_s: float = RECENT_WINDOW_S) -> None:
        self._banks = {bank: 0.0 for bank in banks}
        self._started = started
        self._window_s = window_s
        self._first_start: float | None = None  # device time: the first job's queue time
        self._latest_end = 0.0  # device time: the latest D2H end
        self._compute_end = 0.0  # device time: the latest compute end (for the union)
        self._busy = 0.0
        self._h2d = self._compute = self._d2h = 0.0
        self._d2d = 0.0
        self._d2d_bytes = 0
        self._sampling = 0.0
        self._tokens = 0
        self._copies = JobCopies()
        self._recent: deque[_Bucket] = deque()

    def record(
        self,
        bank: EngineSlot,
        stamps: JobTimestamps | None,
        tokens: int,
        sampling_s: float,
        now: float,
        copies: JobCopies | None = None,
    ) -> None:
        """Add one finished device job.

        Args:
            bank: the bank it ran on.
            stamps: its device timestamps (None or non-finite: only its tokens and sampling count).
            tokens: tokens it streamed to client jobs.
            sampling_s: host seconds spent sampling it.
            now: monotonic wall time.
            copies: what its sampling copied and read (None: not sampled).
        """
        bucket = self._bucket(now)
        if copies is not None:
            self._copies = self._copies.plus(copies)
        self._sampling += sampling_s
        self._tokens += tokens
        bucket.tokens += tokens
        if stamps is None or not all(math.isfinite(t) for t in (stamps.queued, stamps.compute_end, stamps.d2h_end)):
            return
        if self._first_start is None:
            self._first_start = self._latest_end = stamps.queued
        busy = max(0.0, stamps.compute_end - max(stamps.compute_start, self._compute_end))
        self._compute_end = max(self._compute_end, stamps.compute_end)
        device = max(0.0, stamps.d2h_end - self._latest_end)
        self._latest_end = max(self._latest_end, stamps.d2h_end)
        self._busy += busy
        self._banks[bank] = self._banks.get(bank, 0.0) + stamps.compute
        self._h2d += stamps.h2d
        self._compute += stamps.compute
        self._d2h += stamps.d2h
        self._d2d += stamps.d2d_seconds
        self._d2d_bytes += stamps.d2d_bytes
        bucket.busy += busy
        bucket.device += device

    def view(self, now: float) -> UtilizationView:
        """The figures at monotonic wall time `now`."""
        device = self._latest_end - self._first_start if self._first_start is not None else 0.0
        oldest = math.floor(now - self._window_s)
        recent = [b for b in self._recent if b.second >= oldest]
        window = max(0.0, now - max(float(oldest), self._started))
        busy_recent = sum(b.busy for b in recent)
        device_recent = sum(b.device for b in recent)
        return UtilizationView(
            device_seconds=device,
            busy_seconds=self._busy,
            busy_ratio=_ratio(self._busy, device),
            banks=tuple(BankUtilizationView(bank, busy, _ratio(busy, device)) for bank, busy in self._banks.items()),
            h2d_seconds=self._h2d,
            compute_seconds=self._compute,
            d2h_seconds=self._d2h,
            d2d_seconds=self._d2d,
            d2d_bytes=self._d2d_bytes,
            sampling_seconds=self._sampling,
            d2h_bytes=self._copies.d2h_bytes,
            sampled_rows=self._copies.rows,
            full_row_reads=self._copies.full_row_reads,
            generated_tokens=self._tokens,
            tokens_per_second=sum(b.tokens for b in recent) / window if window > 0 else 0.0,
            recent_busy_ratio=_ratio(busy_recent, device_recent),
            recent_window_seconds=window,
        )

    def _bucket(self, now: float) -> _Bucket:
        """The bucket of `now`'s wall second (buckets older than the window are dropped)."""
        second = math.floor(now)
        if not self._recent or self._recent[-1].second != second:
            self._recent.append(_Bucket(second))
        oldest = math.floor(now - self._window_s)
        while self._recent[0].second < oldest:
            self._recent.popleft()
        return self._recent[-1]


def _ratio(part: float, whole: float) -> float:
    return min(1.0, part / whole) if whole > 0 else 0.0
