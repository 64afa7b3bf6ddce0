"""`calculet-daemon`: one process per board. Flags override the TOML config file.

Data flow: argv -> the settings (`settings.py`: `build_parser`, `merged_settings` of the `[daemon]`
table of `--config` and the flags given, `config_from` checking every value) -> the board lock
(`ownership.BoardLock` in `runtime_dir`, before the device is opened) -> a check of the Unix socket
path -> the driver's `open` -> `DeviceCore` -> `serve`.

Every refusal is one line on stderr and an exit status (`exit_status`): EXIT_USAGE (2) for a bad flag
or config value (a driver refusing its options included), EXIT_BOARD_BUSY (3) when another live
daemon holds the board's lock or another process its device (`DeviceBusy`), EXIT_SOCKET_IN_USE (4)
when a live process listens on the Unix socket path, EXIT_FAILURE (1) for anything else (a startup
model that fails to load, ...); EXIT_OK (0) after a clean stop; EXIT_DEVICE_UNHEALTHY (75) when the
device was lost and a reset did not restore it, so the supervisor restarts the daemon (systemd:
`Restart=on-failure`; `--unhealthy-exit off` keeps it up, NOT_SERVING, instead).

Under systemd (`systemd/calculet-daemon@.service`, Type=notify) the process reports itself through
`$NOTIFY_SOCKET` (`common/sd_notify.py`: load progress, READY=1, STATUS=, WATCHDOG=1, STOPPING=1), and
SIGHUP re-reads `--config` (`reload_config`: the log level and new startup models).

    calculet-daemon --board 0 --device calsim --listen unix:run/board0.sock \
        --models-root models --model tiny=tiny --time-scale 0 --policy continuous --max-inflight 2
"""

from __future__ import annotations

from calculet.common import process_start

# Before the imports below: one OpenBLAS thread, and no collector passes over what they build.
process_start.one_blas_thread()
_PAUSED = process_start.pause_collector()

import argparse
import asyncio
import dataclasses
import gc
import logging
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from calculet.common.errors import CalculetError, ErrorKind, InvalidArgument
from calculet.common.parent_death import die_with_parent
from calculet.common.sd_notify import Notifier
from calculet.common.telemetry.logs import setup_logging
from calculet.common.telemetry.tracing_env import tracing_requested
from calculet.daemon.core.config import DaemonConfig
from calculet.daemon.core.device_core import DeviceCore
from calculet.daemon.core.models import LoadProgress
from calculet.daemon.core.resets.escalations import EXIT_DEVICE_UNHEALTHY
from calculet.daemon.device.api import VirtualDevice
from calculet.daemon.device.errors import DeviceBusy
from calculet.daemon.device.registry import load_driver
from calculet.daemon.server.access import ServerSecurity
from calculet.daemon.server.app import DEFAULT_MAX_MESSAGE_BYTES, check_listen, serve
from calculet.daemon.server.ownership import BoardBusy, BoardLock, SocketInUse
from calculet.daemon.settings import (
    build_parser,
    config_from,
    int_setting,
    log_format,
    log_level,
    merged_settings,
    runtime_dir,
    security_from,
    text_setting,
)
from calculet.daemon.telemetry.http import parse_listen
from calculet.daemon.telemetry.job_log import JobLog

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

    from calculet.daemon.telemetry.daemon_metrics import MetricsEndpoint

process_start.resume_collector(_PAUSED)

log = logging.getLogger("calculet.daemon")

EXIT_OK = 0  # a clean stop (SIGTERM / SIGINT)
EXIT_FAILURE = 1  # any other refusal: a startup model that fails to load, a device that cannot be opened, ...
EXIT_USAGE = 2  # a bad flag or config value, a driver refusing its options
EXIT_BOARD_BUSY = 3  # another live daemon holds the board's lock, or another process its device
EXIT_SOCKET_IN_USE = 4  # a live process listens on the Unix socket path
# EXIT_DEVICE_UNHEALTHY (75, EX_TEMPFAIL; `core.escalations`): the device stayed unhealthy after a reset.

GIL_SWITCH_INTERVAL_S = 0.001  # CPython switch interval while serving (default 0.005; see _serve_board)


def open_device(config: DaemonConfig) -> VirtualDevice:
    """Open the board through its driver, with `config.device_options`.

    Raises:
        InvalidArgument: the driver refused its options (its message, prefixed `device_options:`).
        CalculetError: any other refusal of the driver (no such board: NOT_FOUND, ...).
    """
    driver = load_driver(config.device)
    try:
        return driver.open(config.board, config.device_options)
    except CalculetError as exc:
        if exc.kind is ErrorKind.INVALID_ARGUMENT:
            raise InvalidArgument(f"device_options: {exc}") from None
        raise
    except (ValueError, TypeError, KeyError) as exc:  # a driver that refuses outside the contract
        raise InvalidArgument(f"device_options: device {config.device} refused them: {exc}") from None


def _log_progress(p: LoadProgress) -> None:
    # Byte counts between the first and the last of a phase (up to ~100 per load) only at DEBUG.
    level = logging.DEBUG if 0 < p.bytes_done < p.bytes_total else logging.INFO
    counted = f" ({p.bytes_done:,}/{p.bytes_total:,} B)" if p.bytes_total else ""
    log.log(level, "load %s generation %d: %s %s%s", p.alias, p.generation, p.state.value, p.message, counted)


def reload_config(args: argparse.Namespace, core: DeviceCore) -> None:
    """SIGHUP: re-read `--config` (flags still override it) and apply what may change while serving:
    the log level, and the startup models whose alias is not loaded, loaded one by one (blocking: call
    it from a worker thread). A model removed from the file stays loaded (`calctl unload` removes it),
    a loaded alias whose path changed is not reloaded (`calctl load --replace`), and other settings
    take effect at the next start. A file that does not read or check is logged and changes nothing.
    """
    if args.config is None:
        log.info("SIGHUP: no --config to re-read")
        return
    try:
        settings = merged_settings(args)
        level, fmt = log_level(settings), log_format(settings)
        new = config_from(settings)
    except CalculetError as exc:
        log.error("SIGHUP: %s not applied, nothing changed: %s", args.config, exc)
        return
    setup_logging(level, fmt)
    later = [
        f.name
        for f in dataclasses.fields(new)
        if f.name != "models" and getattr(new, f.name) != getattr(core.config, f.name)
    ]
    if later:
        log.warning("SIGHUP: %s changed %s: applied at the next start", args.config, ", ".join(later))
    loaded = {m.alias for m in core.health().models}
    for alias, path in new.models:
        if alias in loaded:
            continue
        log.info("SIGHUP: loading %s from %s", alias, path)
        try:
            core.load(alias, path, _log_progress)
        except CalculetError as exc:
            log.error("SIGHUP: loading %s from %s failed: %s", alias, path, exc)
    log.info("SIGHUP: %s reloaded (log level %s)", args.config, level)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the daemon. Returns an exit status: EXIT_OK after a clean stop, else see `exit_status`."""
    die_with_parent()  # started by `calctl up`: stop with it
    args = build_parser().parse_args(argv)
    try:
        settings = merged_settings(args)
        setup_logging(log_level(settings), log_format(settings))
        config = config_from(settings)
        listen = text_setting(settings, "listen", f"unix:run/board{config.board}.sock")
        max_message_bytes = int_setting(settings, "max_message_bytes", DEFAULT_MAX_MESSAGE_BYTES, 1)
        security = security_from(settings, listen)
        health_listen = (
            text_setting(settings, "health_listen", "") if settings.get("health_listen") is not None else None
        )
        metrics_listen = (
            text_setting(settings, "metrics_listen", "") if settings.get("metrics_listen") is not None else None
        )
        if metrics_listen is not None:
            parse_listen(metrics_listen)  # a malformed address fails before the device is opened
        # Before the device is opened; held until the process ends (the kernel drops it if it dies).
        board_lock = BoardLock.acquire(runtime_dir(settings), config.board)
    except CalculetError as exc:
        return _fail(exc)
    with board_lock:
        log.info("board %d: lock %s held by pid %d", config.board, board_lock.path, os.getpid())
        # Beside the lock, written only by its holder: the reset audit trail outlives a restart.
        journal = board_lock.path.parent / f"calculet-board{config.board}-resets.jsonl"
        config = dataclasses.replace(config, audit_journal=journal)
        return _serve_board(config, listen, max_message_bytes, args, security, health_listen, metrics_listen)


def _serve_board(
    config: DaemonConfig,
    listen: str,
    max_message_bytes: int,
    args: argparse.Namespace,
    security: ServerSecurity,
    health_listen: str | None = None,
    metrics_listen: str | None = None,
) -> int:
    try:
        check_listen(listen)  # a live socket: refuse before opening the device and loading models
        device = open_device(config)
        try:
            core = DeviceCore(config, device)
        except BaseException:
            device.close()
            raise
    except CalculetError as exc:
        return _fail(exc)
    notifier = Notifier.from_environ()  # systemd's NOTIFY_SOCKET; does nothing without it

    def progress(p: LoadProgress) -> None:
        _log_progress(p)
        notifier.status(f"load {p.alias} generation {p.generation}: {p.state.name} {p.message}")

    metrics: MetricsEndpoint | None = None
    tracing: TracerProvider | None = None
    try:
        # Before start: the metrics observe the startup models' warm-up jobs too.
        metrics = _metrics(core, metrics_listen)
        tracing = _observe_jobs(core)
        core.start(progress=progress)
        # Start-up objects live forever: keep them out of full collections (docs/performance.md
        # measured 23-26 ms full-GC pauses as the p99 tail).
        gc.collect()
        gc.freeze()
        # A device thread that wakes (a job done, a bank free) waits for the GIL while the gRPC loop
        # streams tokens; at CPython's default 5 ms switch interval that wait sits between one device
        # job and the next. 1 ms: 0.1-0.2 ms less TPOT over the modelled step at concurrency 1 (A/B, 3 runs).
        sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
        asyncio.run(
            serve(
                core, listen, max_message_bytes=max_message_bytes, grace_s=config.drain_timeout_s,
                notifier=notifier, reload=lambda: reload_config(args, core), security=security,
                health_listen=health_listen,
            )
        )  # fmt: skip
    except CalculetError as exc:
        core.close()
        return _fail(exc)
    finally:
        notifier.close()
        if metrics is not None:
            metrics.close()
        if tracing is not None:
            tracing.shutdown()  # exports the spans still batched
    if core.exit_reason:
        print(f"calculet-daemon: device unhealthy, restart me: {core.exit_reason}", file=sys.stderr)
        return EXIT_DEVICE_UNHEALTHY
    return EXIT_OK


def _metrics(core: DeviceCore, listen: str | None) -> MetricsEndpoint | None:
    """The metrics endpoint on `listen` (None: off). Imported only then: OpenTelemetry takes ~0.15 s.

    Raises:
        InvalidArgument: a bad address or one that cannot be bound.
    """
    if listen is None:
        return None
    from calculet.daemon.telemetry.daemon_metrics import MetricsEndpoint

    return MetricsEndpoint(core, listen)


def _observe_jobs(core: DeviceCore) -> TracerProvider | None:
    """Job log lines (unless the log level hides them) and, when `OTEL_TRACES_EXPORTER` asks for
    it, job spans; returns the tracer provider to shut down at exit (None: tracing off, and
    OpenTelemetry is not imported for it).

    Raises:
        InvalidArgument: `OTEL_TRACES_EXPORTER` names an exporter that is not installed.
    """
    if logging.getLogger("calculet.daemon.jobs").isEnabledFor(logging.INFO):
        core.engine.add_observer(JobLog())
    if not tracing_requested():
        return None
    from calculet.common.telemetry.tracing import tracer_provider_from_env
    from calculet.daemon.telemetry.job_traces import JobTraces

    provider = tracer_provider_from_env("calculet-daemon")
    if provider is not None:
        core.engine.add_observer(JobTraces(provider))
    return provider


def exit_status(exc: CalculetError) -> int:
    """EXIT_BOARD_BUSY (the board's lock or its device is held), EXIT_SOCKET_IN_USE, EXIT_USAGE for a
    bad value (INVALID_ARGUMENT), else EXIT_FAILURE."""
    if isinstance(exc, BoardBusy | DeviceBusy):
        return EXIT_BOARD_BUSY
    if isinstance(exc, SocketInUse):
        return EXIT_SOCKET_IN_USE
    return EXIT_USAGE if exc.kind is ErrorKind.INVALID_ARGUMENT else EXIT_FAILURE


def _fail(exc: CalculetError) -> int:
    """One line on stderr; the exit status for `exc` (`exit_status`)."""
    print(f"calculet-daemon: {exc.kind.value}: {exc}", file=sys.stderr)
    return exit_status(exc)


if __name__ == "__main__":
    sys.exit(main())
