"""The gateway's settings: the `[gateway]` table of a TOML file, overridden by flags.

Keys are spelled like the flags (`-` or `_`); unknown keys are refused so a typo cannot be
silently ignored. Every value is checked here; `GatewayConfig` holds only valid settings.

    [gateway]
    listen = "127.0.0.1:8000"          # or "unix:/run/calculet/gateway.sock"
    daemons = ["unix:/run/calculet/board0.sock", "unix:/run/calculet/board1.sock"]
    dns = ["calculet-boards.default.svc.cluster.local:50051"]
    dns-interval = 10                  # seconds between DNS re-resolutions
    api-key-file = "/etc/calculet/gateway-api-keys"     # /v1/* needs `Authorization: Bearer <key>`
    daemon-token-file = "/etc/calculet/inference-token" # sent to every daemon
    daemon-ca = "/etc/calculet/daemon-ca.pem"           # TLS to host:port daemons
    daemon-cert = "/etc/calculet/gateway.pem"           # with daemon-key: mutual TLS
    daemon-key = "/etc/calculet/gateway.key"
    daemon-server-name = "calculet-daemon"              # the name in the daemons' certificates
    routing = "prefix"                 # or "load": the load-only rule, for comparison (docs/gateway.md)
    answer-memory-tokens = 4000000     # chat answers' token ids kept for the next turn; 0 = off (the default)
    workers = 2                        # processes serving the one listen socket (1, the default: one process)
    max-body-bytes = 4194304           # a request body over this is refused with 413 before it is read whole
    thinking-budgets = "low=512,medium=2048,high=8192"  # thinking tokens per reasoning_effort (or a table)

    placement = "demand"               # or "off" (the default): only operators load models
    placement-queue = 64               # requests per model waiting for a board (429 beyond)
    placement-wait = 120               # seconds one may wait for its model to get a board (503 after)
    min-residency = 60                 # seconds a freshly placed model keeps its board
    idle-ttl = 300                     # seconds without a request before a model's board may go
    daemon-operate-token-file = "/etc/calculet/operate-token"  # sent with placement's switches

    [gateway.models.qwen]              # the model catalog (`fleet.catalog`; TOML only, no flag)
    package = "qwen"
    min-boards = 1

The files are read here, once, at start-up: an unreadable or empty one is a bad setting (exit 2).
Secrets never appear in `GatewayConfig`'s repr.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from calculet.client import TlsConfig
from calculet.client.channel import call_metadata, check_server_name, read_pem_file
from calculet.common.errors import InvalidArgument
from calculet.common.secret_files import read_secret_lines
from calculet.common.telemetry.logs import LOG_FORMATS
from calculet.gateway.api.auth import read_api_keys
from calculet.gateway.api.thinking import DEFAULT_BUDGETS, EFFORTS, MAX_BUDGET
from calculet.gateway.fleet.catalog import CatalogModel, catalog_from
from calculet.gateway.placement.policy import PlacementPolicy
from calculet.gateway.placement.waiters import MAX_QUEUE, QueueBounds
from calculet.gateway.routing.policy import RoutingMode
from calculet.gateway.text.answer_memory import DEFAULT_MAX_TOKENS as DEFAULT_ANSWER_MEMORY_TOKENS

KEYS = frozenset(
    {
        "listen", "daemons", "dns", "dns-interval", "dns-hosts-file", "load-interval-ms", "max-attempts",
        "failover-wait", "log-level", "api-key-file", "daemon-token-file", "daemon-ca", "daemon-cert", "daemon-key",
        "daemon-server-name", "log-format", "routing", "answer-memory-tokens", "models", "placement",
        "placement-queue", "placement-wait", "min-residency", "idle-ttl", "daemon-operate-token-file", "workers",
        "max-body-bytes", "thinking-budgets",
    }
)  # fmt: skip
TLS_KEYS = ("daemon-ca", "daemon-cert", "daemon-key", "daemon-server-name")
MAX_ANSWER_MEMORY_TOKENS = 2**31  # 8 GiB of ids: past any sane gateway's memory
MAX_WORKERS = 64  # worker processes: past the cores of any host a gateway runs on
# A request body's default bound: a full 40,960-token context is about 160 KB of text, so 4 MiB leaves
# room for long conversations and batches of prompts, and bounds what one request can make the
# gateway hold (its text, the parsed request, the rendered prompt and its tokens).
DEFAULT_MAX_BODY_BYTES = 4 << 20
MAX_BODY_BYTES_LIMIT = 1 << 30


@dataclass(frozen=True)
class GatewayConfig:
    """Attributes:
    listen: `HOST:PORT` or `unix:PATH` for HTTP.
    daemons: static daemon targets.
    dns: `NAME:PORT` names whose addresses are daemons (re-resolved every `dns_interval_s`).
    dns_hosts_file: resolve `dns` names from this hosts-format file instead of the system ("" = system).
    load_interval_ms: WatchLoad period asked of each daemon.
    max_attempts: submits per choice across boards (first try, retries and failovers).
    failover_wait_s: mid-stream, how long to wait for a board to come (back) up.
    log_level: DEBUG, INFO, WARNING, ERROR.
    log_format: text, or json (one object a line).
    api_key_file: the file of HTTP API keys ("" = the API is open); api_keys: its keys.
    daemon_token_file: the file of the inference-plane token sent to every daemon ("" = none);
        daemon_token: the token (the file's first).
    daemon_tls: TLS to `host:port` daemons (None = plaintext); its files were checked here and are
        read again by each new daemon connection.
    routing: how boards are picked: by estimated time to first token with prefix reuse (prefix),
        or by load alone (load).
    answer_memory_tokens: the most token ids of chat answers kept for splicing into the next
        turn (`AnswerMemory`); 0 disables it.
    catalog: every model the fleet may serve (`fleet.catalog`), alias order; () = none declared.
    placement: "demand" (the gateway switches boards to the catalog models asked for,
        docs/models.md) or "off" (only operators load models).
    placement_bounds: the queue per model and how long a request may wait in it.
    placement_policy: the minimum residency and the idle TTL.
    daemon_operate_token_file / daemon_operate_token: the operate-plane token placement's switches
        send ("" / None: the inference token).
    workers: processes serving `listen` (`gateway.workers`, docs/gateway.md "Workers"); 1 = this
        process serves it alone.
    max_body_bytes: a request body over this is refused with 413 (docs/gateway.md "Bounded requests").
    thinking_budgets: the thinking tokens of each `reasoning_effort` (docs/gateway.md "Tools and
        reasoning").
    """

    listen: str = "127.0.0.1:8000"
    daemons: tuple[str, ...] = ()
    dns: tuple[str, ...] = ()
    dns_interval_s: float = 10.0
    dns_hosts_file: str = ""
    load_interval_ms: int = 1000
    max_attempts: int = 6
    failover_wait_s: float = 15.0
    log_level: str = "INFO"
    log_format: str = "text"
    api_key_file: str = ""
    api_keys: tuple[bytes, ...] = field(default=(), repr=False)
    daemon_token_file: str = ""
    daemon_token: str | None = field(default=None, repr=False)
    daemon_tls: TlsConfig | None = None
    routing: RoutingMode = RoutingMode.PREFIX
    answer_memory_tokens: int = DEFAULT_ANSWER_MEMORY_TOKENS
    catalog: tuple[CatalogModel, ...] = ()
    placement: str = "off"
    placement_bounds: QueueBounds = field(default_factory=QueueBounds)
    placement_policy: PlacementPolicy = field(default_factory=PlacementPolicy)
    daemon_operate_token_file: str = ""
    daemon_operate_token: str | None = field(default=None, repr=False)
    workers: int = 1
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    thinking_budgets: Mapping[str, int] = field(default_factory=lambda: dict(DEFAULT_BUDGETS))


PLACEMENT_MODES = ("off", "demand")


@dataclass(frozen=True)
class ListenAddress:
    """Where the gateway listens: a Unix socket path (`uds`), or a host (brackets of an IPv6 one
    removed) and a port."""

    uds: str | None = None
    host: str = ""
    port: int = 0


def listen_address(listen: str) -> ListenAddress:
    """`listen` (`unix:PATH` or `HOST:PORT`) parsed: what uvicorn and the workers' supervisor bind.

    Raises:
        InvalidArgument: not `unix:PATH` with a path, nor `HOST:PORT` with a host and port.
    """
    if listen.startswith("unix:"):
        if not listen.removeprefix("unix:"):
            raise InvalidArgument("listen: unix: needs a socket path")
        return ListenAddress(uds=listen.removeprefix("unix:"))
    host, sep, port = listen.rpartition(":")
    if not sep or not host.strip("[]") or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise InvalidArgument(f"listen: expected HOST:PORT or unix:PATH, got {listen!r}")
    return ListenAddress(host=host.strip("[]"), port=int(port))


def read_config(path: Path) -> dict[str, Any]:
    """The `[gateway]` table of `path`, keys normalised to dashes.

    Raises:
        InvalidArgument: unreadable, not TOML, no `[gateway]` table, or unknown keys.
    """
    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as err:
        raise InvalidArgument(f"config {path}: {err}") from err
    table = document.get("gateway")
    if not isinstance(table, dict):
        raise InvalidArgument(f"config {path}: needs a [gateway] table")
    settings = {key.replace("_", "-"): value for key, value in table.items()}
    unknown = sorted(set(settings) - KEYS)
    if unknown:
        raise InvalidArgument(f"config {path}: unknown keys {', '.join(unknown)} (known: {', '.join(sorted(KEYS))})")
    return settings


def config_from(settings: dict[str, Any]) -> GatewayConfig:
    """Check every setting.

    Raises:
        InvalidArgument: a wrong type or a value out of range, naming the key; no board at all; a
            key, token or TLS file that cannot be read or holds nothing usable.
    """
    cfg = GatewayConfig(
        listen=_text(settings, "listen", GatewayConfig.listen),
        daemons=_texts(settings, "daemons"),
        dns=_texts(settings, "dns"),
        dns_interval_s=_number(settings, "dns-interval", GatewayConfig.dns_interval_s, 0.1, 86400),
        dns_hosts_file=_optional_text(settings, "dns-hosts-file"),
        load_interval_ms=_integer(settings, "load-interval-ms", GatewayConfig.load_interval_ms, 50, 60000),
        max_attempts=_integer(settings, "max-attempts", GatewayConfig.max_attempts, 1, 100),
        failover_wait_s=_number(settings, "failover-wait", GatewayConfig.failover_wait_s, 0, 3600),
        log_level=_text(settings, "log-level", GatewayConfig.log_level).upper(),
        log_format=_text(settings, "log-format", GatewayConfig.log_format),
        api_key_file=_optional_text(settings, "api-key-file"),
        daemon_token_file=_optional_text(settings, "daemon-token-file"),
        daemon_tls=_daemon_tls(settings),
        routing=_routing(settings),
        answer_memory_tokens=_integer(
            settings, "answer-memory-tokens", GatewayConfig.answer_memory_tokens, 0, MAX_ANSWER_MEMORY_TOKENS
        ),
        catalog=catalog_from(settings.get("models", {})),
        placement=_text(settings, "placement", GatewayConfig.placement),
        placement_bounds=QueueBounds(
            _integer(settings, "placement-queue", QueueBounds.max_waiting, 1, MAX_QUEUE),
            _number(settings, "placement-wait", QueueBounds.wait_s, 0.1, 3600),
        ),
        placement_policy=PlacementPolicy(
            _number(settings, "min-residency", PlacementPolicy.min_residency_s, 0, 86400),
            _number(settings, "idle-ttl", PlacementPolicy.idle_ttl_s, 0, 86400 * 7),
        ),
        daemon_operate_token_file=_optional_text(settings, "daemon-operate-token-file"),
        workers=_integer(settings, "workers", GatewayConfig.workers, 1, MAX_WORKERS),
        max_body_bytes=_integer(settings, "max-body-bytes", GatewayConfig.max_body_bytes, 1024, MAX_BODY_BYTES_LIMIT),
        thinking_budgets=_thinking_budgets(settings),
    )
    if cfg.placement not in PLACEMENT_MODES:
        raise InvalidArgument(f"placement: one of {', '.join(PLACEMENT_MODES)}, got {cfg.placement!r}")
    if cfg.placement == "demand" and not cfg.catalog:
        raise InvalidArgument("placement = demand needs a model catalog ([gateway.models.ALIAS] tables)")
    if cfg.log_level not in {"DEBUG", "INFO", "WARNING", "ERROR"}:
        raise InvalidArgument(f"log-level: one of DEBUG, INFO, WARNING, ERROR, got {cfg.log_level!r}")
    if cfg.log_format not in LOG_FORMATS:
        raise InvalidArgument(f"log-format: one of {', '.join(LOG_FORMATS)}, got {cfg.log_format!r}")
    listen_address(cfg.listen)
    if not cfg.daemons and not cfg.dns:
        raise InvalidArgument("no boards: give --daemon TARGET or --dns NAME:PORT (or daemons/dns in the config)")
    if cfg.api_key_file:
        cfg = replace(cfg, api_keys=read_api_keys(Path(cfg.api_key_file)))
    if cfg.daemon_token_file:
        cfg = replace(cfg, daemon_token=_daemon_token(Path(cfg.daemon_token_file)))
    if cfg.daemon_operate_token_file:
        token = _daemon_token(Path(cfg.daemon_operate_token_file), "daemon-operate-token-file")
        cfg = replace(cfg, daemon_operate_token=token)
    return cfg


def _thinking_budgets(settings: dict[str, Any]) -> dict[str, int]:
    """`thinking-budgets`: a table, or `low=N,medium=N,high=N` (a flag); an effort left out keeps its
    default.

    Raises: InvalidArgument: an unknown effort, or a budget that is not a whole number in range."""
    value = settings.get("thinking-budgets", {})
    if isinstance(value, str):
        pairs = [item.partition("=") for item in value.split(",") if item.strip()]
        value = {k.strip(): int(v) if v.strip().isdigit() else v for k, _, v in pairs}
    if not isinstance(value, dict):
        raise InvalidArgument(f"thinking-budgets: a table or low=N,medium=N,high=N, got {value!r}")
    budgets = dict(DEFAULT_BUDGETS)
    for effort, tokens in value.items():
        if effort not in EFFORTS:
            raise InvalidArgument(f"thinking-budgets: unknown effort {effort!r}; one of {', '.join(EFFORTS)}")
        key = f"thinking-budgets.{effort}"
        budgets[effort] = _integer({key: tokens}, key, 0, 0, MAX_BUDGET)
    return budgets


def _routing(settings: dict[str, Any]) -> RoutingMode:
    """Raises: InvalidArgument: not one of the routing modes."""
    value = _text(settings, "routing", GatewayConfig.routing.value)
    modes = [mode.value for mode in RoutingMode]
    if value not in modes:
        raise InvalidArgument(f"routing: one of {', '.join(modes)}, got {value!r}")
    return RoutingMode(value)


def _text(settings: dict[str, Any], key: str, default: str) -> str:
    value = settings.get(key, default)
    if not isinstance(value, str) or not value:
        raise InvalidArgument(f"{key}: must be a non-empty string, got {value!r}")
    return value


def _optional_text(settings: dict[str, Any], key: str) -> str:
    return _text(settings, key, "") if key in settings else ""


def _texts(settings: dict[str, Any], key: str) -> tuple[str, ...]:
    value = settings.get(key, [])
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise InvalidArgument(f"{key}: must be a list of non-empty strings, got {value!r}")
    return tuple(value)


def _number(settings: dict[str, Any], key: str, default: float, low: float, high: float) -> float:
    value = settings.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidArgument(f"{key}: must be a number, got {value!r}")
    if not low <= value <= high:
        raise InvalidArgument(f"{key}: must be in [{low:g}, {high:g}], got {value}")
    return float(value)


def _integer(settings: dict[str, Any], key: str, default: int, low: int, high: int) -> int:
    value = settings.get(key, default)
    if isinstance(value, float) and math.isfinite(value) and not value.is_integer():
        raise InvalidArgument(f"{key}: must be a whole number, got {value!r}")
    return int(_number(settings, key, default, low, high))


def _daemon_token(path: Path, key: str = "daemon-token-file") -> str:
    """The first token of a daemon token file (the daemon's format: one a line, # comments).

    Raises: InvalidArgument: unreadable, no token, or a token that cannot travel in metadata.
    """
    token = read_secret_lines(path, key, "token")[0]
    call_metadata(token)  # the client's own check, here so that a bad file stops the start-up
    return token


def _daemon_tls(settings: dict[str, Any]) -> TlsConfig | None:
    """TLS to daemons when any daemon-* TLS key is given; each file checked (read) now.

    Raises: InvalidArgument: a file unreadable or not PEM, daemon-cert without daemon-key (or the
    reverse), a bad server name.
    """
    given = {key: _optional_text(settings, key) for key in TLS_KEYS}
    if not any(given.values()):
        return None
    if bool(given["daemon-cert"]) != bool(given["daemon-key"]):
        raise InvalidArgument("daemon-cert, daemon-key: give both (mutual TLS) or neither")
    for key in ("daemon-ca", "daemon-cert", "daemon-key"):
        read_pem_file(key, given[key] or None)
    if given["daemon-server-name"]:
        check_server_name("daemon-server-name", given["daemon-server-name"])
    return TlsConfig(
        ca_file=given["daemon-ca"] or None,
        cert_file=given["daemon-cert"] or None,
        key_file=given["daemon-key"] or None,
        server_name=given["daemon-server-name"] or None,
    )
