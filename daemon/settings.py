"""The daemon's settings: the `[daemon]` table of `--config`, overridden by flags, every value checked.

One table, `FLAGS`, holds every flag with its `add_argument` keywords; `build_parser` builds the
argparse parser from it and `FLAG_SETTINGS` (the config-file keys, spelled like the flags with '-' or
'_') is read off it, so a flag and its key cannot drift apart (the gateway's are in gateway/config.py).

Data flow: argv -> `build_parser` -> `merged_settings` (the `[daemon]` table of `--config`, then the
flags given; device options layered, see `merged_settings`) -> `config_from` (every value checked:
type, range, finite) and `security_from`, `runtime_dir`. Every refusal is an `InvalidArgument`, which
`main.py` turns into one line on stderr and EXIT_USAGE.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from calculet.common.errors import InvalidArgument
from calculet.common.telemetry.logs import LOG_FORMATS
from calculet.daemon.core.chunking import chunk_forced, parse_chunk_setting
from calculet.daemon.core.config import POLICIES, DaemonConfig
from calculet.daemon.core.resets.escalations import EXIT_DEVICE_UNHEALTHY
from calculet.daemon.core.scheduler import DECODE_JOBS_AUTO
from calculet.daemon.device.registry import available_drivers
from calculet.daemon.runtime_paths import default_runtime_dir
from calculet.daemon.server.access import Plane, ServerSecurity, load_policy
from calculet.daemon.server.app import DEFAULT_MAX_MESSAGE_BYTES, normalize_target, unix_path

TABLE_SETTINGS = ("models", "device_options")
# Settings that are shorthands for one device option each: setting -> option.
DEVICE_OPTION_SHORTHANDS = {"time_scale": "time_scale", "fault_plan": "fault_plan", "device_profile": "profile"}
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
DEFAULT_RETENTION_BYTES = DaemonConfig.retention_bytes  # 256 MiB
DEFAULT_RETENTION_S = DaemonConfig.retention_s  # 10 minutes


@dataclass(frozen=True)
class Flag:
    """One flag: its `add_argument` names and keywords. `setting`: it is also a config-file key (its
    name with '_'); `--config`, `--model` and `--device-option` are not (the file has the `models` and
    `device_options` tables instead)."""

    names: tuple[str, ...]
    options: Mapping[str, Any]
    setting: bool = True

    @property
    def key(self) -> str:
        return self.names[0].removeprefix("--").replace("-", "_")


def _flag(*names: str, setting: bool = True, **options: Any) -> Flag:
    return Flag(names, options, setting)


# In `--help` order.
FLAGS: tuple[Flag, ...] = (
    _flag("--config", setting=False, type=Path, help="TOML file ([daemon] table); flags override it"),
    _flag("--board", type=int, help="board index on this host (default 0)"),
    _flag("--device", help="device driver name (default calsim)"),
    _flag("--listen", help="unix:PATH, PATH.sock or HOST:PORT (default unix:run/board<N>.sock)"),
    _flag("--models-root", type=Path, help="package paths must resolve inside this directory"),
    _flag(
        "--model", setting=False, action="append", default=[], metavar="ALIAS=PATH", help="startup model (repeatable)"
    ),
    _flag("--tls-cert", type=Path, help="PEM server certificate: TCP listeners use TLS"),
    _flag("--tls-key", type=Path, help="PEM key of --tls-cert"),
    _flag("--tls-client-ca", type=Path, help="PEM CA: clients must present a certificate it signed (mTLS)"),
    _flag(
        "--health-listen",
        help="HOST:PORT of a plaintext listener serving only grpc.health.v1, for probes that cannot use TLS",
    ),
    _flag(
        "--metrics-listen",
        metavar="HOST:PORT",
        help="serve Prometheus metrics over plain HTTP at http://HOST:PORT/metrics (off; port 0 picks a free one)",
    ),
    _flag("--insecure", action="store_true", default=None, help="allow plain TCP without TLS (trusted networks only)"),
    *(
        _flag(
            f"--token-file-{plane}",
            type=Path,
            help=f"bearer tokens of the {plane} plane, one per line (any token file turns token checks on)",
        )
        for plane in ("inference", "observe", "operate")
    ),
    _flag(
        "--runtime-dir",
        type=Path,
        help="directory of the board lock calculet-board<N>.lock (default $RUNTIME_DIRECTORY, else "
        "$XDG_RUNTIME_DIR/calculet, else /run/calculet if writable, else /tmp/calculet-<uid>)",
    ),
    _flag(
        "--device-option",
        setting=False,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help='driver option, repeatable (last wins); VALUE is JSON if it parses (0.5, true, "text"), else raw text',
    ),
    _flag(
        "--device-profile",
        metavar="NAME",
        help="device option profile (calsim: calrt-0.7.6, the default, calrt-1.0.0 or calsim-dev)",
    ),
    _flag(
        "--time-scale",
        type=float,
        help="device option time_scale (calsim: wall seconds per modelled second; 0 = never sleep)",
    ),
    _flag("--fault-plan", type=Path, help="device option fault_plan (calsim: JSON fault plan file)"),
    _flag("--fault-injection", action="store_true", default=None, help="enable the InjectFault RPC"),
    _flag("--policy", choices=POLICIES, help="continuous (default) or serial (one device job at a time)"),
    _flag("--max-inflight", type=int, choices=(1, 2), help="jobs in flight (default 2)"),
    _flag("--job-timeout", type=float, help="seconds to wait for one device job before a reset"),
    _flag(
        "--orphan-timeout", type=float, help="cancel a job with no Wait stream for this many seconds (60; 0 = never)"
    ),
    _flag("--drain-timeout", type=float, help="seconds unload/drain/shutdown wait for running jobs"),
    _flag(
        "--min-residency-s",
        type=float,
        help="seconds a model must have been Ready before a switch may replace it, unless forced (0)",
    ),
    _flag("--queue-depth", type=int, help="waiting requests before Submit is refused"),
    _flag("--admission-timeout", type=float, help="seconds a request may wait for a KV lane"),
    _flag(
        "--retention-bytes",
        type=int,
        help=f"estimated bytes of finished jobs kept for Wait re-attach and Submit retries, oldest evicted first "
        f"(default {DEFAULT_RETENTION_BYTES}; 0 keeps none)",
    ),
    _flag(
        "--retention-seconds",
        type=float,
        help=f"seconds a finished job is kept after its Final at most (default {DEFAULT_RETENTION_S:g})",
    ),
    _flag(
        "--reset-limit",
        type=int,
        help="automatic resets allowed per --reset-window before the board stops serving and waits for an operator (3)",
    ),
    _flag(
        "--submit-error-streak",
        type=int,
        help="consecutive device submit errors that drain the board, NOT_SERVING with the reason, until "
        "`calctl resume` (5; 0 = never)",
    ),
    _flag("--reset-window", type=float, help="seconds of the automatic reset budget's window (600)"),
    _flag(
        "--ccu-escalation",
        type=int,
        help=f"CCU exceptions within --escalation-window that reset the compute units automatically; when "
        f"they recur within the window after that reset, a configuration reset and re-warm follow "
        f"({DaemonConfig.ccu_escalation}; 0 = never)",
    ),
    _flag(
        "--nan-escalation",
        type=int,
        help=f"device jobs with non-finite logits of one model generation within --escalation-window that "
        f"quarantine it and re-run its golden check: it serves again, rolls back to the package it replaced, "
        f"or is unloaded ({DaemonConfig.nan_escalation}; 0 = never)",
    ),
    _flag(
        "--escalation-window",
        type=float,
        help=f"seconds of the CCU and NaN escalations' window ({DaemonConfig.escalation_window_s:g})",
    ),
    _flag(
        "--unhealthy-exit",
        choices=("on", "off"),
        help=f"when the device is lost and a reset does not restore it, exit with status "
        f"{EXIT_DEVICE_UNHEALTHY} for the supervisor to restart the daemon (on); off: stay up, NOT_SERVING",
    ),
    _flag(
        "--decode-jobs-per-model",
        type=int,
        choices=(0, 1, 2),
        help="decode jobs of one model in flight: 0 = auto (default: a second cohort only when the ready "
        "sequences alone fill the largest decode batch), 1 = one batch of every ready sequence, "
        "2 = two cohorts alternating between the ping/pong banks",
    ),
    _flag(
        "--prefix-reuse",
        choices=("auto", "on", "off"),
        help="keep finished conversations' KV in their lanes (parked) and reuse the longest shared token "
        "prefix for new requests: auto (default: where the package's prefill is proven to run at an "
        "offset), on (forced: a package without it fails to load), off",
    ),
    _flag(
        "--prefix-min-tokens",
        type=int,
        help=f"shortest shared prefix a request takes a parked lane for ({DaemonConfig.prefix_min_tokens})",
    ),
    _flag(
        "--prefill-chunk-tokens",
        help="tokens per prefill job: longer prompts run as chunks with decode steps between them; auto "
        "(default: about 4 decode steps of the package's timing, in 64-token blocks, where the package's "
        "prefill is proven to run at an offset), on or a number (forced: a package without it fails to "
        "load), off",
    ),
    _flag(
        "--max-message-bytes",
        type=int,
        help=f"largest request the daemon receives (default {DEFAULT_MAX_MESSAGE_BYTES}: enough for a 40,960-token "
        "context; raise it for larger models)",
    ),
    _flag("--log-level", default=None, help="DEBUG, INFO (default), WARNING"),
    _flag("--log-format", default=None, choices=LOG_FORMATS, help="text (default) or json: one object a line"),
)

# Settings a config file may hold: the flag names, with '-' or '_' (README), plus `models` and
# `device_options` (tables).
FLAG_SETTINGS = tuple(flag.key for flag in FLAGS if flag.setting)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="calculet-daemon", description="Serve one Calculet board over gRPC.")
    for flag in FLAGS:
        p.add_argument(*flag.names, **flag.options)
    return p


def read_config(path: Path) -> dict[str, Any]:
    """The `[daemon]` table of a TOML file, keys normalised to the flag names with '_'.

    Raises:
        InvalidArgument: unreadable file, bad TOML, `daemon` not a table, an unknown key.
    """
    import tomllib  # only a daemon given --config reads TOML (every daemon start imports this module)

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
            options[option] = text_setting(source, key, "")


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


def int_setting(settings: Mapping[str, Any], key: str, default: int, minimum: int, maximum: int = 2**31 - 1) -> int:
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


def _auto_on_off(settings: Mapping[str, Any], key: str) -> str:
    """A feature given as auto (the default: where the package allows it), on (forced) or off; a config
    file's true/false mean on/off."""
    value = settings.get(key, "auto")
    if isinstance(value, bool):
        return "on" if value else "off"
    if value in ("auto", "on", "off"):
        return str(value)
    raise InvalidArgument(f"{key}: must be auto, on or off (true or false in a config file), got {value!r}")


def text_setting(settings: Mapping[str, Any], key: str, default: str) -> str:
    value = settings.get(key, default)
    if isinstance(value, Path):
        return str(value)
    if not isinstance(value, str) or not value:
        raise InvalidArgument(f"{key}: must be a non-empty string, got {value!r}")
    return value


def log_format(settings: dict[str, Any]) -> str:
    """Raises: InvalidArgument: not one of LOG_FORMATS."""
    fmt = text_setting(settings, "log_format", "text")
    if fmt not in LOG_FORMATS:
        raise InvalidArgument(f"log_format: must be one of {', '.join(LOG_FORMATS)}, got {fmt!r}")
    return fmt


def log_level(settings: dict[str, Any]) -> str:
    """Raises: InvalidArgument: not one of LOG_LEVELS (any case)."""
    level = text_setting(settings, "log_level", "INFO").upper()
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
    device = text_setting(settings, "device", "calsim")
    if device not in available_drivers():
        raise InvalidArgument(f"device: no driver named {device!r}; available: {', '.join(available_drivers())}")
    fault_injection = settings.get("fault_injection", False)
    if not isinstance(fault_injection, bool):
        raise InvalidArgument(f"fault_injection: must be true or false, got {fault_injection!r}")
    options = _options_table(settings)
    _fold_shorthands(options, settings)  # settings not from `merged_settings` may still hold them
    reuse = _auto_on_off(settings, "prefix_reuse")
    chunk = str(settings.get("prefill_chunk_tokens", "auto"))
    return DaemonConfig(
        board=int_setting(settings, "board", 0, 0),
        device=device,
        device_options=options,
        models_root=Path(text_setting(settings, "models_root", ".")),
        models=tuple((a, str(p)) for a, p in settings.get("models", {}).items()),
        policy=text_setting(settings, "policy", "continuous"),
        max_inflight=int_setting(settings, "max_inflight", 2, 1),
        job_timeout_s=_seconds(settings, "job_timeout", 30.0, zero_ok=False),
        fault_injection=fault_injection,
        drain_timeout_s=_seconds(settings, "drain_timeout", 30.0, zero_ok=True),
        min_residency_s=_seconds(settings, "min_residency_s", 0.0, zero_ok=True),
        queue_depth=int_setting(settings, "queue_depth", 1024, 1),
        admission_timeout_s=_seconds(settings, "admission_timeout", 30.0, zero_ok=False),
        decode_jobs_per_model=int_setting(settings, "decode_jobs_per_model", DECODE_JOBS_AUTO, 0, 2),
        orphan_timeout_s=_seconds(settings, "orphan_timeout", 60.0, zero_ok=True) or None,
        retention_bytes=int_setting(settings, "retention_bytes", DEFAULT_RETENTION_BYTES, 0, 2**48),
        retention_s=_seconds(settings, "retention_seconds", DEFAULT_RETENTION_S, zero_ok=False),
        reset_limit=int_setting(settings, "reset_limit", DaemonConfig.reset_limit, 0),
        submit_error_streak=int_setting(settings, "submit_error_streak", DaemonConfig.submit_error_streak, 0),
        ccu_escalation=int_setting(settings, "ccu_escalation", DaemonConfig.ccu_escalation, 0),
        nan_escalation=int_setting(settings, "nan_escalation", DaemonConfig.nan_escalation, 0),
        escalation_window_s=_seconds(settings, "escalation_window", DaemonConfig.escalation_window_s, zero_ok=False),
        unhealthy_exit=_on_off(settings, "unhealthy_exit", DaemonConfig.unhealthy_exit),
        reset_window_s=_seconds(settings, "reset_window", DaemonConfig.reset_window_s, zero_ok=False),
        prefix_reuse=reuse != "off",
        prefix_reuse_forced=reuse == "on",
        prefix_min_tokens=int_setting(settings, "prefix_min_tokens", DaemonConfig.prefix_min_tokens, 1),
        prefill_chunk=parse_chunk_setting(chunk),
        prefill_chunk_forced=chunk_forced(chunk),
    )


def security_from(settings: Mapping[str, Any], listen: str) -> ServerSecurity:
    """TLS, `--insecure` and the access planes' token files.

    Raises:
        InvalidArgument: a half TLS configuration, plain TCP without `insecure`, or a token file that
            cannot be read or is empty.
    """

    def path(key: str) -> Path | None:
        return Path(text_setting(settings, key, "")) if settings.get(key) is not None else None

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
        return Path(text_setting(settings, "runtime_dir", "")).absolute()
    return default_runtime_dir(environ)
