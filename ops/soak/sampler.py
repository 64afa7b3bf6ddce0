"""Process usage samples: RSS, open file descriptors, threads and inbound client connections of the
gateway and of every board process, every few seconds, with psutil.

Each pid is its own `ProcessSeries` (a restarted board starts a new one; the old one is marked
ended). `processes` is asked at every sample for what runs now, so restarts are followed. A
process that vanishes between the question and the sample is simply not sampled that time.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable
from typing import Any

import psutil

from calculet.ops.soak.growth import ProcessSeries, UsageSample
from calculet.ops.soak.timeline import Timeline

Running = Callable[[], list[tuple[str, str, int]]]
"""() -> (name, role, pid) of every process to sample now."""


def inbound_connections(connections: Iterable[Any]) -> int:
    """Established TCP connections on a port the process listens on (psutil `sconn`s of one
    process): its clients' connections, as opposed to the ones it opened itself."""
    conns = list(connections)
    listening = {c.laddr.port for c in conns if c.status == psutil.CONN_LISTEN and c.laddr}
    return sum(1 for c in conns if c.status == psutil.CONN_ESTABLISHED and c.laddr and c.laddr.port in listening)


class UsageSampler:
    """Samples the processes `running` names (module docstring)."""

    def __init__(self, running: Running, timeline: Timeline) -> None:
        self._running = running
        self._timeline = timeline
        self._series: dict[int, ProcessSeries] = {}
        self._procs: dict[int, psutil.Process] = {}

    def sample(self) -> None:
        """One sample of every running process."""
        now = self._timeline.now()
        current = {pid for _, _, pid in self._running()}
        for pid, series in self._series.items():
            if pid not in current:
                series.ended = True
        for name, role, pid in self._running():
            series = self._series.setdefault(pid, ProcessSeries(name, role, pid))
            try:
                proc = self._procs.setdefault(pid, psutil.Process(pid))
                with proc.oneshot():
                    rss, fds, threads = proc.memory_info().rss, proc.num_fds(), proc.num_threads()
                    inbound = inbound_connections(proc.net_connections(kind="tcp"))
                sample = UsageSample(now, rss, fds, threads, inbound)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                series.ended = True
                continue
            series.samples.append(sample)

    async def run(self, interval_s: float, stop: asyncio.Event) -> None:
        """Sample every `interval_s` until `stop` is set."""
        while not stop.is_set():
            self.sample()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval_s)

    def series(self) -> list[ProcessSeries]:
        """Every series: the gateway first, then the boards by name and start."""

        def order(s: ProcessSeries) -> tuple[bool, str, float]:
            return (s.role != "gateway", s.name, s.samples[0].t_s if s.samples else 0.0)

        return sorted(self._series.values(), key=order)
