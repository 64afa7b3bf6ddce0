"""A suite configuration as a local fleet: `calculet.ops.fleet.LocalFleet` (what `calctl up` runs)
with the configuration's policy, in-flight limit, boards, package and time scale.

Owns the daemon flags the suite adds and why: `--max-inflight` (the configuration's); a long
`--admission-timeout` (a closed loop with more clients than lanes queues in the daemon, for as long
as the run needs); `--job-timeout` above the longest modelled job at the fleet's time scale (a
40,900-token prefill is ~1,800 modelled seconds; the default 30 s would reset the board); and a
free TCP port for the gateway. Processes, logs (`<dir>/fleets/<name>/logs/`) and the stop order
belong to `LocalFleet`.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from pathlib import Path

from calculet.ops.bench.suite.estimate import RunEstimate
from calculet.ops.bench.suite.matrix import FleetSpec
from calculet.ops.fleet import FleetConfig

HOST = "127.0.0.1"
ADMISSION_TIMEOUT_S = 86_400.0
MIN_JOB_TIMEOUT_S = 30.0
JOB_TIMEOUT_MARGIN = 2.0


def free_port(host: str = HOST) -> int:
    """A TCP port nothing listens on now (the kernel's choice; free until someone takes it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def job_timeout_s(estimates: Sequence[RunEstimate], time_scale: float) -> float:
    """A device job's wall deadline: 30 s plus twice the longest modelled request at `time_scale`."""
    longest = max((e.longest_request_s for e in estimates), default=0.0)
    return MIN_JOB_TIMEOUT_S + JOB_TIMEOUT_MARGIN * longest * time_scale


def daemon_flags(fleet: FleetSpec, job_timeout: float) -> tuple[str, ...]:
    """The flags the suite adds to each daemon of `fleet` (module docstring)."""
    return (
        "--max-inflight", str(fleet.max_inflight),
        "--admission-timeout", f"{ADMISSION_TIMEOUT_S:g}",
        "--job-timeout", f"{job_timeout:g}",
    )  # fmt: skip


def fleet_config(
    fleet: FleetSpec,
    suite_dir: Path,
    models_root: Path,
    package: str,
    alias: str,
    time_scale: float,
    flags: Sequence[str],
) -> FleetConfig:
    """The `LocalFleet` configuration of `fleet` serving `package` (a directory of `models_root`)
    as `alias`, its working directory `<suite_dir>/fleets/<name>`."""
    return FleetConfig(
        workdir=suite_dir / "fleets" / fleet.name,
        boards=fleet.boards,
        model=alias,
        package=package,
        models_root=models_root,
        host=HOST,
        port=free_port(),
        time_scale=time_scale,
        policy=fleet.policy.value,
        daemon_args=tuple(flags),
    )
