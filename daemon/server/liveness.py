"""Liveness apart from readiness: the grpc.health.v1 service `calculet.liveness`.

Readiness (services `""`, `calculet.v1.Daemon` and each model alias) says whether the board takes
work now: it reads NOT_SERVING while the board is drained, past its automatic reset budget (waiting
for an operator) or without a Ready model, and a restart cures none of these. Liveness says whether
only a restart can help: it reads SERVING while the engine thread's own loop beats
(`DeviceCore.on_heartbeat`, as the systemd watchdog does) and the board is not lost, and NOT_SERVING
when the engine thread has not beaten for `timeout_s` (wedged) or the board needs a restart (device
lost or unusable, a device thread crashed: halt LOST). A Kubernetes livenessProbe asks for it by name.

The threshold is `--job-timeout` + `LIVENESS_MARGIN_S` (30 + 40 = 70 s by default): under
`--policy serial` the engine thread itself waits on one device job for up to the job timeout and
then resets the compute units; the margin covers the age of the last beat (at most
`LIVENESS_BEAT_S`) and that reset, as systemd's `WatchdogSec=90s` does for the same loop.

Data flow: the engine thread calls `EngineBeats.beat` (a time stamp under a lock; it returns whether
the beat ends a silence) -> the servicer (`DaemonServicer.sync_health`, on the event loop) reads
`EngineBeats.expires_in` and `needs_restart`, publishes `LIVENESS_SERVICE`, and arms a loop timer
for the moment the last beat grows too old, so a wedged engine turns liveness NOT_SERVING without
any RPC; the first beat after a silence wakes the loop again.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from calculet.common.errors import InvalidArgument
from calculet.daemon.core.device_core import DeviceCore
from calculet.daemon.core.observe.status import HealthView
from calculet.daemon.core.resets.budget import BoardHalt

LIVENESS_SERVICE = "calculet.liveness"  # the grpc.health.v1 service name of liveness
LIVENESS_MARGIN_S = 40.0  # beyond the job timeout: the last beat's age plus a compute-unit reset
LIVENESS_BEAT_S = 5.0  # the engine beats for liveness at least this often (every half of it at most)


@dataclass(frozen=True)
class LivenessPolicy:
    """How long the engine thread may stay silent, and how often it is asked to beat.

    Raises:
        InvalidArgument: a value that is not a finite positive number of seconds, or a beat interval
            longer than half the timeout (a healthy engine would look wedged between two beats).
    """

    timeout_s: float
    beat_s: float = LIVENESS_BEAT_S

    def __post_init__(self) -> None:
        for name, value in (("timeout", self.timeout_s), ("beat interval", self.beat_s)):
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise InvalidArgument(f"liveness {name}: must be a positive number of seconds, got {value!r}")
        if self.beat_s * 2 > self.timeout_s:
            raise InvalidArgument(
                f"liveness beat interval {self.beat_s} s: must be at most half the timeout ({self.timeout_s} s)"
            )

    @classmethod
    def for_job_timeout(cls, job_timeout_s: float) -> LivenessPolicy:
        """The daemon's policy: silent for longer than one device job plus a reset means wedged."""
        return cls(job_timeout_s + LIVENESS_MARGIN_S)


class EngineBeats:
    """When the engine thread last beat; thread-safe. Starts as if it had just beaten.

    Args:
        timeout_s: silence after which the engine counts as wedged.
        clock: monotonic seconds (tests pass their own).
    """

    def __init__(self, timeout_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._timeout_s = timeout_s
        self._clock = clock
        self._lock = threading.Lock()
        self._last = clock()

    def beat(self) -> bool:
        """Record a beat (engine thread; never blocks for long). Returns whether it ends a silence
        of `timeout_s` or more, that is whether liveness may have been published NOT_SERVING."""
        with self._lock:
            now = self._clock()
            silent = now - self._last >= self._timeout_s
            self._last = now
            return silent

    def expires_in(self) -> float:
        """Seconds until the last beat is too old; 0 or less: the engine is silent too long now."""
        with self._lock:
            return self._last + self._timeout_s - self._clock()


def needs_restart(core: DeviceCore, view: HealthView) -> bool:
    """Whether only a process restart can make the board serve again: its device is lost or unusable,
    or a device thread crashed (halt LOST). Drained, waiting for an operator after the reset budget
    (halt AWAITING_OPERATOR) and no Ready model are not reasons. Looks further than `view` only when
    the device is already reported unhealthy."""
    if view.device_healthy:
        return False
    return core.snapshot().halt is BoardHalt.LOST or not core.device.healthy()
