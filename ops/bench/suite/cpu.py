"""Host CPU over one suite run: the daemons', the gateway's and this process's (the client's) CPU
seconds, and how busy the whole host was, so the report can say whether the host was the limit.

`CpuMeter(roles)` reads, with psutil, the user + system CPU seconds of every process of each role
and the host's CPU times; `CpuMeter.sample()` before and after a run, `cpu_json(before, after, ...)`
the differences: seconds per role, microseconds per streamed output token (daemons + gateway, and
everything), and `host_busy`, the share of all cores that were not idle over the run (above
`HOST_LIMIT` the report flags the run: the host, not the device, may have set its pace). A process
that has exited counts what it used until its last sample.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psutil

HOST_LIMIT = 0.9


@dataclass(frozen=True)
class CpuSample:
    """CPU seconds per role, and the host's busy and total CPU seconds (all cores)."""

    roles: dict[str, float]
    host_busy_s: float
    host_total_s: float


def _busy(times: Any) -> float:
    idle = times.idle + getattr(times, "iowait", 0.0)
    return float(sum(times) - idle)


class CpuMeter:
    """Samples the CPU of a fixed set of processes. Not thread-safe.

    Args:
        roles: role name -> process ids (e.g. {"daemons": [...], "gateway": [...], "client": [pid]}).
    """

    def __init__(self, roles: Mapping[str, Sequence[int]]) -> None:
        self._procs: dict[str, list[psutil.Process]] = {}
        self._last: dict[int, float] = {}
        for role, pids in roles.items():
            self._procs[role] = []
            for pid in pids:
                try:
                    self._procs[role].append(psutil.Process(pid))
                except psutil.NoSuchProcess:
                    continue

    def _seconds(self, proc: psutil.Process) -> float:
        try:
            t = proc.cpu_times()
            self._last[proc.pid] = t.user + t.system
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass  # exited: what it used until its last sample
        return self._last.get(proc.pid, 0.0)

    def sample(self) -> CpuSample:
        roles = {role: sum(self._seconds(p) for p in procs) for role, procs in self._procs.items()}
        host = psutil.cpu_times()
        return CpuSample(roles, _busy(host), float(sum(host)))


def cpu_json(before: CpuSample, after: CpuSample, tokens: int, server_roles: Sequence[str]) -> dict[str, Any]:
    """The run's CPU figures (module docstring).

    Args:
        before / after: samples around the run.
        tokens: output tokens streamed over it (warm-up included).
        server_roles: the roles that serve (their sum is the serving stack's CPU per token).
    """
    seconds = {role: after.roles[role] - before.roles.get(role, 0.0) for role in after.roles}
    total = after.host_total_s - before.host_total_s
    busy = (after.host_busy_s - before.host_busy_s) / total if total > 0 else None
    serving = sum(seconds.get(r, 0.0) for r in server_roles)
    every = sum(seconds.values())
    return {
        "seconds": seconds,
        "us_per_token_serving": serving / tokens * 1e6 if tokens else None,
        "us_per_token_all": every / tokens * 1e6 if tokens else None,
        "host_busy": busy,
        "host_limited": busy is not None and busy > HOST_LIMIT,
    }
