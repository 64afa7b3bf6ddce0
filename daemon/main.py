"""`calculet-daemon`: one process per board. Flags override the TOML config file.

Data flow: argv -> `build_parser` -> `merged_settings` (the `[daemon]` table of `--config`, keys
spelled like the flags with '-' or '_', then the flags given; device options layered, see
`merged_settings`) -> `config_from` (every value checked: type, range, finite) -> the board lock
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

import argparse
import asyncio
import dataclasses
import gc
import json
import logging
import math
import os
import sys
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from calculet.common.errors import CalculetError, ErrorKind, InvalidArgument
from calculet.common.parent_death import die_with_parent
from calculet.common.sd_notify import Notifier
from calculet.common.telemetry.logs import LOG_FORMATS, setup_logging
from calculet.common.telemetry.tracing_env import tracing_requested
from calculet.daemon.core.chunking import parse_chunk_setting
from calculet.daemon.core.config import POLICIES, DaemonConfig
from calculet.daemon.core.device_core import DeviceCore
from calculet.daemon.core.models import LoadProgress
from calculet.daemon.core.resets.escalations import EXIT_DEVICE_UNHEALTHY
from calculet.daemon.core.scheduler import DECODE_JOBS_AUTO
from calculet.daemon.device.api import VirtualDevice
from calculet.daemon.device.errors import DeviceBusy
from calculet.daemon.device.registry import available_drivers, load_driver
from calculet.daemon.runtime_paths import default_runtime_dir
from calculet.daemon.server.access import Plane, ServerSecurity, load_policy
from calculet.daemon.server.app import DEFAULT_MAX_MESSAGE_BYTES, check_listen, normalize_target, serve, unix_path
from calculet.daemon.server.ownership import BoardBusy, BoardLock, SocketInUse
from calculet.daemon.telemetry.http import parse_listen
from calculet.daemon.telemetry.job_log import JobLog

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

    from calculet.daemon.telemetry.daemon_metrics import MetricsEndpoint

log = logging.getLogger("calculet.daemon")

EXIT_OK = 0  # a clean stop (SIGTERM / SIGINT)
EXIT_FAILURE = 1  # any other refusal: a startup model that fails to load, a device that cannot be opened, ...
EXIT_USAGE = 2  # a bad flag or config value, a driver refusing its options
EXIT_BOARD_BUSY = 3  # another live daemon holds the board's lock, or another process its device
EXIT_SOCKET_IN_USE = 4  # a live process listens on the Unix socket path
# EXIT_DEVICE_UNHEALTHY (75, EX_TEMPFAIL; `core.escalations`): the device stayed unhealthy after a reset.

GIL_SWITCH_INTERVAL_S = 0.001  # CPython switch interval while serving (default 0.005; see _serve_board)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="calculet-daemon", description="Serve one Calculet board over gRPC.")
    p.add_argument("--config", type=Path, help="TOML file ([daemon] table); flags override it")
    p.add_argument("--board", type=int, help="board index on this host (default 0)")
    p.add_argument("--device", help="device driver name (default calsim)")
    p.add_argument("--listen", help="unix:PATH, PATH.sock or HOST:PORT (default unix:run/board<N>.sock)")
    p.add_argument("--models-root", type=Path, help="package paths must resolve inside this directory")
    p.add_argument("--model", action="append", default=[], metavar="ALIAS=PATH", help="startup model (repeatable)")
    p.add_argument("--tls-cert", type=Path, help="PEM server certificate: TCP listeners use TLS")
    p.add_argument("--tls-key", type=Path, help="PEM key of --tls-cert")
    p.add_argument("--tls-client-ca", type=Path, help="PEM CA: clients must present a certificate it signed (mTLS)")
    p.add_argument(
        "--health-listen",
        help="HOST:PORT of a plaintext listener serving only grpc.health.v1, for probes that cannot use TLS",
    )
    p.add_argument(
        "--metrics-listen",
        metavar="HOST:PORT",
        help="serve Prometheus metrics over plain HTTP at http://HOST:PORT/metrics (off; port 0 picks a free one)",
    )
    p.add_argument(
        "--insecure", action="store_true", default=None, help="allow plain TCP without TLS (trusted networks only)"
    )
    for plane in ("inference", "observe", "operate"):
        p.add_argument(
            f"--token-file-{plane}",
            type=Path,
            help=f"bearer tokens of the {plane} plane, one per line (any token file turns token checks on)",
        )
    p.add_argument(
        "--runtime-dir",
        type=Path,
        help="directory of the board lock calculet-board<N>.lock (default $RUNTIME_DIRECTORY, else "
        "$XDG_RUNTIME_DIR/calculet, else /run/calculet if writable, else /tmp/calculet-<uid>)",
    )
    p.add_argument(
        "--device-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help='driver option, repeatable (last wins); VALUE is JSON if it parses (0.5, true, "text"), else raw text',
    )
    p.add_argument(
        "--device-profile",
        metavar="NAME",
        help="device option profile (calsim: calrt-0.7.6, the default, calrt-1.0.0 or calsim-dev)",
    )
    p.add_argument(
        "--time-scale",
        type=float,
        help="device option time_scale (calsim: wall seconds per modelled second; 0 = never sleep)",
    )
    p.add_argument("--fault-plan", type=Path, help="device option fault_plan (calsim: JSON fault plan file)")
    p.add_argument("--fault-injection", action="store_true", default=None, help="enable the InjectFault RPC")
    p.add_argument("--policy", choices=POLICIES, help="continuous (default) or serial (today's product)")
    p.add_argument("--max-inflight", type=int, choices=(1, 2), help="jobs in flight (default 2)")
    p.add_argument("--job-timeout", type=float, help="seconds to wait for one device job before a reset")
    p.add_argument(
        "--orphan-timeout", type=float, help="cancel a job with no Wait stream for this many seconds (60; 0 = never)"
    )
    p.add_argument("--drain-timeout", type=float, help="seconds unload/drain/shutdown wait for running jobs")
    p.add_argument(
        "--min-residency-s",
        type=float,
        help="seconds a model must have been Ready before a switch may replace it, unless forced (0)",
    )
    p.add_argument("--queue-depth", type=int, help="waiting requests before Submit is refused")
    p.add_argument("--admission-timeout", type=float, help="seconds a request may wait for a KV lane")
    p.add_argument(
        "--retention-bytes",
        type=int,
        help=f"estimated bytes of finished jobs kept for Wait re-attach and Submit retries, oldest evicted first "
        f"(default {DEFAULT_RETENTION_BYTES}; 0 keeps none)",
    )
    p.add_argument(
        "--retention-seconds",
        type=float,
        help=f"seconds a finished job is kept after its Final at most (default {DEFAULT_RETENTION_S:g})",
    )
    p.add_argument(
        "--reset-limit",
        type=int,
        help="automatic resets allowed per --reset-window before the board stops serving and waits for an operator (3)",
    )
    p.add_argument(
        "--submit-error-streak",
        type=int,
        help="consecutive device submit errors that drain the board, NOT_SERVING with the reason, until "
        "`calctl resume` (5; 0 = never)",
    )
    p.add_argument("--reset-window", type=float, help="seconds of the automatic reset budget's window (600)")
    p.add_argument(
        "--ccu-escalation",
        type=int,
        help=f"CCU exceptions within --escalation-window that reset the compute units automatically; when "
        f"they recur within the window after that reset, a configuration reset and re-warm follow "
        f"({DaemonConfig.ccu_escalation}; 0 = never)",
    )
    p.add_argument(
        "--nan-escalation",
        type=int,
        help=f"device jobs with non-finite logits of one model generation within --escalation-window that "
        f"quarantine it and re-run its golden check: it serves again, rolls back to the package it replaced, "
        f"or is unloaded ({DaemonConfig.nan_escalation}; 0 = never)",
    )
    p.add_argument(
        "--escalation-window",
        type=float,
        help=f"seconds of the CCU and NaN escalations' window ({DaemonConfig.escalation_window_s:g})",
    )
    p.add_argument(
        "--unhealthy-exit",
        choices=("on", "off"),
        help=f"when the device is lost and a reset does not restore it, exit with status "
        f"{EXIT_DEVICE_UNHEALTHY} for the supervisor to restart the daemon (on); off: stay up, NOT_SERVING",
    )
    p.add_argument(
        "--decode-jobs-per-model",
        type=int,
        choices=(0, 1, 2),
        help="decode jobs of one model in flight: 0 = auto (default: a second cohort only when the ready "
        "sequences alone fill the largest decode batch), 1 = one batch of every ready sequence, "
        "2 = two cohorts alternating between the ping/pong banks",
    )
    p.add_argument(
        "--prefix-reuse",
        choices=("on", "off"),
        help="keep finished conversations' KV in their lanes (parked) and reuse the longest shared token "
        "prefix for new requests (on)",
    )
    p.add_argument(
        "--prefix-min-tokens",
        type=int,
        help=f"shortest shared prefix a request takes a parked lane for ({DaemonConfig.prefix_min_tokens})",
    )
    p.add_argument(
        "--prefill-chunk-tokens",
        help="tokens per prefill job: longer prompts run as chunks with decode steps between them; auto "
        "(default: about 4 decode steps of the package's timing, in 64-token blocks), off, or a number",
    )
    p.add_argument(
        "--max-message-bytes",
        type=int,
        help=f"largest request the daemon receives (default {DEFAULT_MAX_MESSAGE_BYTES}: enough for a 40,960-token "
        "context; raise it for larger models)",
    )
    p.add_argument("--log-level", default=None, help="DEBUG, INFO (default), WARNING")
    p.add_argument("--log-format", default=None, choices=LOG_FORMATS, help="text (default) or json: one object a line")
    return p


# Settings a config file may hold: the flag names, with '-' or '_' (README), plus `models` and
# `device_options` (tables).
FLAG_SETTINGS = (
    "board", "device", "listen", "models_root", "time_scale", "fault_plan", "fault_injection", "policy",
    "max_inflight", "job_timeout", "drain_timeout", "queue_depth", "admission_timeout", "decode_jobs_per_model",
    "orphan_timeout", "max_message_bytes", "log_level", "retention_bytes", "retention_seconds", "runtime_dir",
    "device_profile", "reset_limit", "reset_window", "tls_cert", "tls_key", "tls_client_ca", "insecure",
    "token_file_inference", "token_file_observe", "token_file_operate", "health_listen", "metrics_listen",
    "log_format", "prefix_reuse", "prefix_min_tokens", "prefill_chunk_tokens", "submit_error_streak",
    "ccu_escalation", "nan_escalation", "escalation_window", "unhealthy_exit", "min_residency_s",
)  # fmt: skip
TABLE_SETTINGS = ("models", "device_options")
# Settings that are shorthands for one device option each: setting -> option.
DEVICE_OPTION_SHORTHANDS = {"time_scale": "time_scale", "fault_plan": "fault_plan", "device_profile": "profile"}
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
DEFAULT_RETENTION_BYTES = DaemonConfig.retention_bytes  # 256 MiB
DEFAULT_RETENTION_S = DaemonConfig.retention_s  # 10 minutes


def read_config(path: Path) -> dict[str, Any]:
    """The `[daemon]` table of a TOML file, keys normalised to the flag names with '_'.

    Raises:
        InvalidArgument: unreadable file, bad TOML, `daemon` not a table, an unknown key.
    """
    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise InvalidArgument(f"config {path}: {exc}") from None
    table = document.get("daemon", {})
    if not isinstance(table, dict):
        raise InvalidArgument(f"config {path}: daemon must be a table ([daemon]), got {table!r}")
    settings = {key.replace("-", "_"): value for key, value in table.items()}
    unknown = sorted(set(settings) - {*FLAG_SETTINGS, *TABLE_SETTINGS})
    if unknown:
        raise InvalidArgument(
            f"config {path}: unknown [daemon] keys {unknown}; known: {', '.join((*FLAG_SETTINGS, *TABLE_SETTINGS))}"
        )
    return settings


def parse_device_option(spec: str) -> tuple[str, Any]:
    """`KEY=VALUE` -> (KEY, VALUE as JSON if it parses as standard JSON, else the raw string).

    `n=4` -> 4, `x=0.5` -> 0.5, `on=true` -> True, `p="a b"` -> "a b", `p=calsim-dev` -> "calsim-dev",
    `v=` -> "" (NaN and Infinity stay strings).

    Raises:
        InvalidArgument: no '=' or an empty KEY.
    """
    key, sep, text = spec.partition("=")
    if not sep or not key.strip():
        raise InvalidArgument(f"--device-option {spec!r}: expected KEY=VALUE")
    try:
        value: Any = json.loads(text, parse_constant=_not_json)
    except ValueError:
        value = text
    return key.strip(), value


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not standard JSON")


def _options_table(settings: Mapping[str, Any]) -> dict[str, Any]:
    table = settings.get("device_options", {})
    if not isinstance(table, dict) or not all(isinstance(k, str) and k for k in table):
        raise InvalidArgument(f"device_options: must be a table of driver options (key = value), got {table!r}")
    return dict(table)


def _fold_shorthands(options: dict[str, Any], source: Mapping[str, Any]) -> None:
    """Set the device option of each shorthand setting `source` holds (checked) in `options`."""
    for key, option in DEVICE_OPTION_SHORTHANDS.items():
        if source.get(key) is None:
            continue
        if key == "time_scale":
            options[option] = _seconds(source, key, 1.0, zero_ok=True)
        else:
            options[option] = _text(source, key, "")


def merged_settings(args: argparse.Namespace) -> dict[str, Any]:
    """Config file values, then flags that were given.

    `device_options` is layered, later wins: the file's `[daemon.device_options]` table, the file's
    shorthand keys (`time_scale`, `fault_plan`, `device_profile` -> `profile`), `--device-option`
    flags in order, the shorthand flags (`--time-scale`, `--fault-plan`, `--device-profile`). The
    shorthand keys are folded into it and leave the settings.

    Raises:
        InvalidArgument: a bad config file (see `read_config`), `models` not a table of paths, a
            `--model` without ALIAS=PATH, a `--device-option` without KEY=VALUE, `device_options` not a
            table, a shorthand of the wrong type.
    """
    file_settings = read_config(args.config) if args.config is not None else {}
    flags = {k: v for k in FLAG_SETTINGS if (v := getattr(args, k)) is not None}
    settings = {**file_settings, **flags}
    options = _options_table(file_settings)
    _fold_shorthands(options, file_settings)
    for spec in args.device_option:
        key, value = parse_device_option(spec)
        options[key] = value
    _fold_shorthands(options, flags)
    for key in DEVICE_OPTION_SHORTHANDS:
        settings.pop(key, None)
    settings["device_options"] = options
    models = settings.get("models", {})
    if not isinstance(models, dict) or not all(isinstance(p, str) for p in models.values()):
        raise InvalidArgument(f'models: must be a table of alias = "package path", got {models!r}')
    models = dict(models)
    for spec in args.model:
        alias, sep, path = spec.partition("=")
        if not sep or not alias or not path:
            raise InvalidArgument(f"--model {spec!r}: expected ALIAS=PATH")
        models[alias] = path
    settings["models"] = models
    return settings


def _int(settings: Mapping[str, Any], key: str, default: int, minimum: int, maximum: int = 2**31 - 1) -> int:
    value = settings.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise InvalidArgument(f"{key}: must be an integer in {minimum}..{maximum}, got {value!r}")
    return value


def _seconds(settings: Mapping[str, Any], key: str, default: float, *, zero_ok: bool) -> float:
    value = settings.get(key, default)
    ok = not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)
    if not ok or value < 0 or (value == 0 and not zero_ok):
        raise InvalidArgument(f"{key}: must be a finite number of seconds {'>=' if zero_ok else '>'} 0, got {value!r}")
    return float(value)


def _on_off(settings: Mapping[str, Any], key: str, default: bool) -> bool:
    """A switch given as "on"/"off" (flags) or true/false (config file)."""
    value = settings.get(key, default)
    if isinstance(value, bool):
        return value
    if value in ("on", "off"):
        return value == "on"
    raise InvalidArgument(f"{key}: must be on or off (true or false in a config file), got {value!r}")


def _text(settings: Mapping[str, Any], key: str, default: str) -> str:
    value = settings.get(key, default)
    if isinstance(value, Path):
        return str(value)
    if not isinstance(value, str) or not value:
        raise InvalidArgument(f"{key}: must be a non-empty string, got {value!r}")
    return value


def log_format(settings: dict[str, Any]) -> str:
    """Raises: InvalidArgument: not one of LOG_FORMATS."""
    fmt = _text(settings, "log_format", "text")
    if fmt not in LOG_FORMATS:
        raise InvalidArgument(f"log_format: must be one of {', '.join(LOG_FORMATS)}, got {fmt!r}")
    return fmt


def log_level(settings: dict[str, Any]) -> str:
    """Raises: InvalidArgument: not one of LOG_LEVELS (any case)."""
    level = _text(settings, "log_level", "INFO").upper()
    if level not in LOG_LEVELS:
        raise InvalidArgument(f"log_level: must be one of {', '.join(LOG_LEVELS)}, got {settings['log_level']!r}")
    return level


def config_from(settings: dict[str, Any]) -> DaemonConfig:
    """The daemon's configuration from merged settings.

    `device_options` (a table) reaches the driver whatever it is; shorthand keys still in `settings`
    (`time_scale`, `fault_plan`, `device_profile`) override its entries. The driver checks them.

    Raises:
        InvalidArgument: a value of the wrong type or range, or a device no driver provides.
    """
    device = _text(settings, "device", "calsim")
    if device not in available_drivers():
        raise InvalidArgument(f"device: no driver named {device!r}; available: {', '.join(available_drivers())}")
    fault_injection = settings.get("fault_injection", False)
    if not isinstance(fault_injection, bool):
        raise InvalidArgument(f"fault_injection: must be true or false, got {fault_injection!r}")
    options = _options_table(settings)
    _fold_shorthands(options, settings)  # settings not from `merged_settings` may still hold them
    return DaemonConfig(
        board=_int(settings, "board", 0, 0),
        device=device,
        device_options=options,
        models_root=Path(_text(settings, "models_root", ".")),
        models=tuple((a, str(p)) for a, p in settings.get("models", {}).items()),
        policy=_text(settings, "policy", "continuous"),
        max_inflight=_int(settings, "max_inflight", 2, 1),
        job_timeout_s=_seconds(settings, "job_timeout", 30.0, zero_ok=False),
        fault_injection=fault_injection,
        drain_timeout_s=_seconds(settings, "drain_timeout", 30.0, zero_ok=True),
        min_residency_s=_seconds(settings, "min_residency_s", 0.0, zero_ok=True),
        queue_depth=_int(settings, "queue_depth", 1024, 1),
        admission_timeout_s=_seconds(settings, "admission_timeout", 30.0, zero_ok=False),
        decode_jobs_per_model=_int(settings, "decode_jobs_per_model", DECODE_JOBS_AUTO, 0, 2),
        orphan_timeout_s=_seconds(settings, "orphan_timeout", 60.0, zero_ok=True) or None,
        retention_bytes=_int(settings, "retention_bytes", DEFAULT_RETENTION_BYTES, 0, 2**48),
        retention_s=_seconds(settings, "retention_seconds", DEFAULT_RETENTION_S, zero_ok=False),
        reset_limit=_int(settings, "reset_limit", DaemonConfig.reset_limit, 0),
        submit_error_streak=_int(settings, "submit_error_streak", DaemonConfig.submit_error_streak, 0),
        ccu_escalation=_int(settings, "ccu_escalation", DaemonConfig.ccu_escalation, 0),
        nan_escalation=_int(settings, "nan_escalation", DaemonConfig.nan_escalation, 0),
        escalation_window_s=_seconds(settings, "escalation_window", DaemonConfig.escalation_window_s, zero_ok=False),
        unhealthy_exit=_on_off(settings, "unhealthy_exit", DaemonConfig.unhealthy_exit),
        reset_window_s=_seconds(settings, "reset_window", DaemonConfig.reset_window_s, zero_ok=False),
        prefix_reuse=_on_off(settings, "prefix_reuse", DaemonConfig.prefix_reuse),
        prefix_min_tokens=_int(settings, "prefix_min_tokens", DaemonConfig.prefix_min_tokens, 1),
        prefill_chunk=parse_chunk_setting(str(settings.get("prefill_chunk_tokens", "auto"))),
    )


def security_from(settings: Mapping[str, Any], listen: str) -> ServerSecurity:
    """TLS, `--insecure` and the access planes' token files.

    Raises:
        InvalidArgument: a half TLS configuration, plain TCP without `insecure`, or a token file that
            cannot be read or is empty.
    """

    def path(key: str) -> Path | None:
        return Path(_text(settings, key, "")) if settings.get(key) is not None else None

    insecure = settings.get("insecure", False)
    if not isinstance(insecure, bool):
        raise InvalidArgument(f"insecure: must be true or false, got {insecure!r}")
    policy = load_policy({plane: path(f"token_file_{plane.value}") for plane in Plane})
    security = ServerSecurity(policy, path("tls_cert"), path("tls_key"), path("tls_client_ca"), insecure)
    target = normalize_target(listen)
    if unix_path(target) is None:
        security.tcp_credentials(target)  # refuse plain TCP before the device is opened
    return security


def runtime_dir(settings: Mapping[str, Any], environ: Mapping[str, str] = os.environ) -> Path:
    """Where the board lock lives, always absolute: `runtime_dir` (flag or config; a relative one is
    taken from the working directory), else the host's fixed default (`runtime_paths`:
    `$RUNTIME_DIRECTORY`, `$XDG_RUNTIME_DIR/calculet`, `/run/calculet`, `/tmp/calculet-<uid>`), so a
    board has one lock whatever directory its daemon starts in.

    Raises:
        InvalidArgument: `runtime_dir` is not a non-empty string, or the default is refused.
    """
    if settings.get("runtime_dir") is not None:
        return Path(_text(settings, "runtime_dir", "")).absolute()
    return default_runtime_dir(environ)


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
        listen = _text(settings, "listen", f"unix:run/board{config.board}.sock")
        max_message_bytes = _int(settings, "max_message_bytes", DEFAULT_MAX_MESSAGE_BYTES, 1)
        security = security_from(settings, listen)
        health_listen = _text(settings, "health_listen", "") if settings.get("health_listen") is not None else None
        metrics_listen = _text(settings, "metrics_listen", "") if settings.get("metrics_listen") is not None else None
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
        # Start-up objects live forever: keep them out of full collections (DESIGN.md section 9
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
