"""The soak's two local fleets and their packages, built on `calctl up`'s machinery.

- Packages under `<models root>`: the preset, built and validated as `calctl up` builds it
  (`ensure_package`), and a copy of it in `<preset>-copy` (validated too): the rollouts go back and
  forth between the two directories, so every board serves byte-identical packages and the answers
  do not change.
- The soak fleet (`<out>/fleet`): `--boards` calsim daemons under `--policy` with
  `--fault-injection`, a short `--job-timeout`, a reset budget sized for the fault cycle
  (`fault_plan.reset_budget`) and `--submit-error-streak 5`, behind the real gateway
  (`--failover-wait 60`) on a free loopback port. With a second model (`calctl soak --models A,B`)
  the gateway reads `calctl up --models`' catalog (`<out>/fleet/gateway.toml`: both models,
  placement by demand, A on at least one board) with a short `--min-residency` and `--idle-ttl`
  (`SWITCH_MIN_RESIDENCY_S`, `SWITCH_IDLE_TTL_S`), so a board the `model_switch` fault took to B
  comes back to A within seconds of B going quiet.
- The reference fleet (`<out>/reference`; `<out>/reference-<B>` for the second model): one board,
  no faults, time scale 0, its own gateway; used only to compute the oracle's answers.

Each fleet is its own emulated host (`LocalFleet`: board locks and calsim state in its directory).
"""

from __future__ import annotations

import shutil
import socket
from collections.abc import Callable
from pathlib import Path

from calculet.daemon.package.validate import validate_package
from calculet.ops.commands.up import catalog_toml, ensure_package
from calculet.ops.fleet import FleetConfig, FleetError

COPY_SUFFIX = "-copy"
SUBMIT_ERROR_STREAK = 5
FAILOVER_WAIT_S = 60
MIN_JOB_TIMEOUT_S = 3.0
# Gateway placement on a `--models A,B` soak fleet (wall seconds): B keeps a board long enough for
# its burst to start there, and leaves it once quiet, so the next fault finds the fleet whole.
SWITCH_MIN_RESIDENCY_S = 20.0
SWITCH_IDLE_TTL_S = 10.0


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on now (the kernel's pick)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def prepare_packages(models_root: Path, preset: str, say: Callable[[str], None] = print) -> tuple[Path, Path]:
    """The preset's package and its copy under `models_root`, built and validated when missing.

    Returns:
        (package, copy) directories; their names relative to `models_root` are what the daemons load.

    Raises:
        FleetError: a build failed or a package is invalid.
    """
    package = ensure_package(models_root, preset, say)
    copy = models_root / f"{preset}{COPY_SUFFIX}"
    if not copy.exists():
        tmp = models_root / f".{preset}{COPY_SUFFIX}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(package, tmp)
        tmp.rename(copy)
    report = validate_package(copy)
    if not report.ok:
        raise FleetError(f"package {copy} is invalid:\n{report.render_text()}")
    return package, copy


def soak_daemon_args(job_timeout_s: float, reset_limit: int, reset_window_s: float) -> tuple[str, ...]:
    """The soak boards' own flags, after the fleet's (module docstring)."""
    return (
        "--fault-injection",
        "--job-timeout", f"{job_timeout_s:g}",
        "--reset-limit", str(reset_limit),
        "--reset-window", f"{reset_window_s:g}",
        "--submit-error-streak", str(SUBMIT_ERROR_STREAK),
    )  # fmt: skip


def soak_fleet_config(
    out: Path,
    models_root: Path,
    presets: tuple[str, ...],
    boards: int,
    time_scale: float,
    daemon_args: tuple[str, ...],
    port: int,
    policy: str = "continuous",
) -> FleetConfig:
    """The fleet under test (module docstring): the boards serve `presets[0]`; with more, the
    gateway's catalog holds them all (written to `<out>/fleet/gateway.toml` here).

    Raises:
        OSError: the catalog could not be written.
    """
    workdir = out / "fleet"
    catalog: tuple[str, ...] = ()
    if len(presets) > 1:
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "gateway.toml").write_text(catalog_toml(presets), encoding="utf-8")
        catalog = (
            "--config", str(workdir / "gateway.toml"),
            "--min-residency", f"{SWITCH_MIN_RESIDENCY_S:g}",
            "--idle-ttl", f"{SWITCH_IDLE_TTL_S:g}",
        )  # fmt: skip
    return FleetConfig(
        workdir=workdir,
        boards=boards,
        model=presets[0],
        package=presets[0],
        models_root=models_root,
        port=port,
        time_scale=time_scale,
        policy=policy,
        daemon_args=daemon_args,
        gateway_args=(*catalog, "--failover-wait", str(FAILOVER_WAIT_S)),
    )


def reference_fleet_config(
    out: Path, models_root: Path, preset: str, port: int, name: str = "reference"
) -> FleetConfig:
    """The oracle's fleet: one clean board at time scale 0 (module docstring), in `<out>/<name>`."""
    return FleetConfig(
        workdir=out / name,
        boards=1,
        model=preset,
        package=preset,
        models_root=models_root,
        port=port,
        time_scale=0.0,
    )
