"""`calculet-gateway`: the OpenAI-compatible HTTP gateway in front of many board daemons.

Data flow: argv -> `build_parser` -> settings (the `[gateway]` table of `--config`, then the flags
given) -> `config_from` (every value checked) -> uvicorn serving `api.app.create_app`, whose
lifespan opens the fleet (discovery, one connection per daemon) inside the server's loop. A bad
setting ends the process with one line on stderr and exit status 2. Under systemd (`Type=notify`,
`$NOTIFY_SOCKET`) it sends READY=1 once it listens and STOPPING=1 when a stop signal arrives.

    calculet-gateway --listen 127.0.0.1:8000 --daemon unix:run/board0.sock --daemon unix:run/board1.sock

Workers: with `--workers N` (N > 1) this process is a supervisor (`workers/serve.py`): it binds the
listening socket and runs N worker processes, each this same program with hidden `--worker-*`
flags, serving that socket with its own fleet, router and answer memory (docs/gateway.md, "Workers").

Access: `--api-key-file` makes every /v1/* request present `Authorization: Bearer <key>` (401
otherwise); `--daemon-token-file` is the inference-plane token sent to every daemon;
`--daemon-ca`, `--daemon-cert`/`--daemon-key` and `--daemon-server-name` give TLS (mutual TLS) to
daemons dialled on `host:port` (Unix-socket daemons are dialled in plaintext).
"""

from __future__ import annotations

from calculet.common import process_start

# Before the imports below: no collector passes over what they build.
_PAUSED = process_start.pause_collector()

import argparse
import gc
import logging
import os
import socket
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import uvicorn

from calculet.client import Transport, parse_target
from calculet.common.errors import InvalidArgument
from calculet.common.parent_death import die_with_parent
from calculet.common.sd_notify import Notifier
from calculet.common.telemetry.logs import setup_logging
from calculet.common.telemetry.tracing import tracer_provider_from_env
from calculet.gateway.api.app import create_app
from calculet.gateway.config import GatewayConfig, config_from, listen_address, read_config
from calculet.gateway.fleet.connection import ClientConnection
from calculet.gateway.fleet.discovery import Discovery, HostsFileResolver
from calculet.gateway.fleet.fleet import Fleet
from calculet.gateway.placement.placer import ModelPlacer, PlacerSettings
from calculet.gateway.routing.policy import RoutingMode
from calculet.gateway.routing.router import Router
from calculet.gateway.serving.choice import RetryPolicy
from calculet.gateway.serving.service import GatewayService
from calculet.gateway.text.answer_memory import AnswerMemory
from calculet.gateway.workers.identity import WorkerIdentity
from calculet.gateway.workers.logs import tag_worker_logs
from calculet.gateway.workers.serve import serve_with_workers

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

process_start.resume_collector(_PAUSED)

log = logging.getLogger("calculet.gateway")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="calculet-gateway", description="OpenAI-compatible gateway over board daemons.")
    p.add_argument("--config", type=Path, help="TOML file ([gateway] table); flags override it")
    p.add_argument("--listen", help="HOST:PORT or unix:PATH (default 127.0.0.1:8000)")
    p.add_argument("--daemon", action="append", default=[], metavar="TARGET", help="board daemon (repeatable)")
    p.add_argument("--dns", action="append", default=[], metavar="NAME:PORT", help="DNS name of daemons (repeatable)")
    p.add_argument("--dns-interval", type=float, help="seconds between DNS re-resolutions (10)")
    p.add_argument("--dns-hosts-file", help="resolve --dns names from this hosts-format file, re-read each round")
    p.add_argument("--load-interval-ms", type=int, help="WatchLoad report period asked of daemons (1000)")
    p.add_argument("--max-attempts", type=int, help="submits per choice across boards, retries included (6)")
    p.add_argument("--failover-wait", type=float, help="mid-stream seconds to wait for a board to come back (15)")
    p.add_argument(
        "--routing",
        choices=[mode.value for mode in RoutingMode],
        help="prefix: lowest estimated time to first token, prefix reuse included (default); load: load only",
    )
    p.add_argument(
        "--answer-memory-tokens",
        type=int,
        metavar="N",
        help="token ids of chat answers kept so the next turn reuses the board's KV exactly; 0 = off (the "
        "default): opt in where a conversation's turns reach one gateway (e.g. 4000000)",
    )
    p.add_argument("--log-level", help="DEBUG, INFO, WARNING, ERROR (INFO)")
    p.add_argument("--log-format", choices=("text", "json"), help="text (default) or json: one object a line")
    p.add_argument(
        "--api-key-file", metavar="FILE", help="API keys, one a line (# comments): /v1/* needs 'Bearer <key>'"
    )
    p.add_argument("--daemon-token-file", metavar="FILE", help="inference-plane token sent to every daemon")
    p.add_argument("--daemon-ca", metavar="FILE", help="PEM CA of the daemons' certificates: TLS to host:port daemons")
    p.add_argument("--daemon-cert", metavar="FILE", help="PEM client certificate for mutual TLS (with --daemon-key)")
    p.add_argument("--daemon-key", metavar="FILE", help="PEM private key of --daemon-cert")
    p.add_argument("--daemon-server-name", metavar="NAME", help="name to expect in the daemons' certificates")
    p.add_argument(
        "--placement",
        choices=("off", "demand"),
        help="demand: switch boards to the catalog models requests ask for (docs/models.md); off (default): "
        "only operators load models",
    )
    p.add_argument("--placement-queue", type=int, help="requests per model waiting for a board (64; 429 beyond)")
    p.add_argument("--placement-wait", type=float, help="seconds a request may wait for its model's board (120)")
    p.add_argument("--min-residency", type=float, help="seconds a placed model keeps its board at least (60)")
    p.add_argument("--idle-ttl", type=float, help="seconds without a request before a model's board may go (300)")
    p.add_argument(
        "--daemon-operate-token-file", metavar="FILE", help="operate-plane token sent with placement's switches"
    )
    p.add_argument("--loop", choices=("auto", "asyncio", "uvloop"), default="auto", help="event loop (auto)")
    p.add_argument(
        "--workers",
        type=int,
        metavar="N",
        help="processes serving the listen address, each with its own view of the boards (1: this process)",
    )
    p.add_argument(
        "--max-body-bytes",
        type=int,
        metavar="N",
        help="request bodies over N bytes are refused with 413 before they are read whole (4194304)",
    )
    p.add_argument(
        "--thinking-budgets",
        metavar="low=N,medium=N,high=N",
        help="thinking tokens per reasoning_effort (low=512,medium=2048,high=8192)",
    )
    # Set by the supervisor on the workers it starts (workers/launcher.py), not by people.
    p.add_argument("--worker-index", type=int, help=argparse.SUPPRESS)
    p.add_argument("--worker-fds", type=_fd_pair, help=argparse.SUPPRESS)
    p.add_argument("--worker-dir", type=Path, help=argparse.SUPPRESS)
    return p


def _fd_pair(text: str) -> tuple[int, int]:
    """`LISTEN,PRIVATE`: the worker's inherited socket descriptors."""
    listen, _, private = text.partition(",")
    if not listen.isdigit() or not private.isdigit():
        raise argparse.ArgumentTypeError(f"expected two descriptors LISTEN,PRIVATE, got {text!r}")
    return int(listen), int(private)


def settings_from(args: argparse.Namespace) -> dict[str, Any]:
    """Config file table, then flags (lists from flags replace the file's)."""
    settings = read_config(args.config) if args.config else {}
    for key in (
        "listen",
        "dns-interval",
        "dns-hosts-file",
        "load-interval-ms",
        "max-attempts",
        "failover-wait",
        "log-level",
        "log-format",
        "api-key-file",
        "daemon-token-file",
        "daemon-ca",
        "daemon-cert",
        "daemon-key",
        "daemon-server-name",
        "routing",
        "placement",
        "placement-queue",
        "placement-wait",
        "min-residency",
        "idle-ttl",
        "daemon-operate-token-file",
        "answer-memory-tokens",
        "workers",
        "max-body-bytes",
        "thinking-budgets",
    ):
        value = getattr(args, key.replace("-", "_"))
        if value is not None:
            settings[key] = value
    if args.daemon:
        settings["daemons"] = args.daemon
    if args.dns:
        settings["dns"] = args.dns
    return settings


def connection_factory(cfg: GatewayConfig) -> Callable[[str], ClientConnection]:
    """Opens the connection to one daemon: the token for every daemon, TLS for `host:port` ones."""

    def connect(target: str) -> ClientConnection:
        tcp = parse_target(target).transport is Transport.TCP
        return ClientConnection(
            target,
            load_interval_ms=cfg.load_interval_ms,
            token=cfg.daemon_token,
            tls=cfg.daemon_tls if tcp else None,
            operate_token=cfg.daemon_operate_token,
        )

    return connect


def requester() -> str:
    """Who placement's switches say asked for them (the boards' audit trails)."""
    return f"gateway {socket.gethostname()} pid {os.getpid()}"


def service_factory(cfg: GatewayConfig):  # type: ignore[no-untyped-def]
    """The app's service context: the fleet is built and closed inside the server's loop."""

    async def make_service() -> AsyncIterator[GatewayService]:
        resolver = HostsFileResolver(Path(cfg.dns_hosts_file)) if cfg.dns_hosts_file else None
        discovery = Discovery(cfg.daemons, cfg.dns, resolver)
        fleet = Fleet(discovery, connection_factory(cfg), cfg.dns_interval_s)
        await fleet.start()
        gc.freeze()  # start-up objects out of the collector's way (docs/performance.md: GC pauses)
        try:
            router = Router(fleet, cfg.routing)
            answers = AnswerMemory(cfg.answer_memory_tokens)
            policy = RetryPolicy(cfg.max_attempts, cfg.failover_wait_s)
            placer = None
            if cfg.placement == "demand":
                settings = PlacerSettings(cfg.placement_policy, cfg.placement_bounds, requester())
                placer = ModelPlacer(fleet, cfg.catalog, settings)
                placer.start()
            service = GatewayService(
                fleet,
                router,
                policy,
                answers=answers,
                catalog=cfg.catalog,
                placer=placer,
                thinking_budgets=cfg.thinking_budgets,
            )
            try:
                yield service
            finally:
                service.close()
                if placer is not None:
                    await placer.close()
        finally:
            await fleet.close()

    return make_service


# How long an idle client connection stays open. uvicorn's default (5 s) equals httpx's pool expiry
# (the openai SDK's), so a client could reuse a connection just as the gateway closed it and see a
# broken connection without any response (the soak found one, issue 21). Longer than the clients'
# pools, the client always closes first, as behind nginx (75 s).
KEEP_ALIVE_S = 75


def worker_from(args: argparse.Namespace, cfg: GatewayConfig) -> WorkerIdentity | None:
    """This process's place among the workers, from the supervisor's hidden flags (None: not a worker).

    Raises:
        InvalidArgument: the worker flags are incomplete or the index is not below `workers`.
    """
    if args.worker_index is None and args.worker_fds is None and args.worker_dir is None:
        return None
    if args.worker_index is None or args.worker_fds is None or args.worker_dir is None:
        raise InvalidArgument("--worker-index, --worker-fds and --worker-dir go together (set by the supervisor)")
    if not 0 <= args.worker_index < cfg.workers:
        raise InvalidArgument(f"--worker-index: must be in [0, {cfg.workers - 1}], got {args.worker_index}")
    return WorkerIdentity(args.worker_index, cfg.workers, args.worker_dir)


def uvicorn_config(
    cfg: GatewayConfig,
    loop: str = "auto",
    tracer_provider: TracerProvider | None = None,
    worker: WorkerIdentity | None = None,
) -> uvicorn.Config:
    """uvicorn's settings for one serving process (`worker`: this process is that worker)."""
    app = create_app(
        service_factory(cfg),
        api_keys=cfg.api_keys,
        tracer_provider=tracer_provider,
        worker=worker,
        max_body_bytes=cfg.max_body_bytes,
    )
    address = listen_address(cfg.listen)
    where: dict[str, Any] = {"uds": address.uds} if address.uds else {"host": address.host, "port": address.port}
    if loop == "auto":
        loop = "uvloop" if _has("uvloop") else "asyncio"
    http = "httptools" if _has("httptools") else "h11"
    return uvicorn.Config(
        app, **where, loop=loop, http=http, log_level=cfg.log_level.lower(), access_log=False,
        timeout_graceful_shutdown=30, timeout_keep_alive=KEEP_ALIVE_S,
    )  # fmt: skip


class NotifyingServer(uvicorn.Server):
    """uvicorn's server, telling systemd when it listens (READY=1) and when it stops (STOPPING=1)."""

    def __init__(self, config: uvicorn.Config, notifier: Notifier) -> None:
        super().__init__(config)
        self.notifier = notifier

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            self.notifier.ready("serving")

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.notifier.stopping("stopping: finishing running requests")
        await super().shutdown(sockets)


def _has(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return False
    return True


def main(argv: Sequence[str] | None = None) -> int:
    die_with_parent()  # started by `calctl up` (or, as a worker, by the supervisor): stop with it
    arguments = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(arguments)
    try:
        cfg = config_from(settings_from(args))
        worker = worker_from(args, cfg)
        supervising = cfg.workers > 1 and worker is None
        # Spans only when OTEL_TRACES_EXPORTER asks for them (tracing.py); request ids regardless.
        tracer_provider = None if supervising else tracer_provider_from_env("calculet-gateway")
        config = None if supervising else uvicorn_config(cfg, args.loop, tracer_provider, worker)
    except InvalidArgument as err:
        print(f"calculet-gateway: {err}", file=sys.stderr)
        return 2
    setup_logging(cfg.log_level, cfg.log_format)
    if worker is not None:
        tag_worker_logs(worker.index)
        log.info("worker %d of %d serving (pid %d)", worker.index, worker.count, os.getpid())
    else:
        log_settings(cfg)
    if config is None:
        return serve_with_workers(cfg, arguments)
    notifier = Notifier.from_environ()
    sockets = [socket.socket(fileno=fd) for fd in args.worker_fds] if worker is not None else None
    try:
        NotifyingServer(config, notifier).run(sockets=sockets)
    finally:
        notifier.close()
        if tracer_provider is not None:
            tracer_provider.shutdown()  # exports the spans still batched
    return 0


def log_settings(cfg: GatewayConfig) -> None:
    """The settings that matter, at start."""
    log.info(
        "gateway on %s; daemons %s; dns %s; routing %s; answer memory %s; catalog %s; placement %s; workers %d",
        cfg.listen, list(cfg.daemons), list(cfg.dns), cfg.routing.value,
        f"{cfg.answer_memory_tokens} tokens" if cfg.answer_memory_tokens else "off",
        [m.alias for m in cfg.catalog], cfg.placement, cfg.workers,
    )  # fmt: skip
    log.info(
        "access: API keys %s; daemon token %s; daemon TLS %s",
        f"required ({len(cfg.api_keys)} from {cfg.api_key_file})" if cfg.api_keys else "off (the API is open)",
        f"from {cfg.daemon_token_file}" if cfg.daemon_token else "none",
        "mutual" if cfg.daemon_tls and cfg.daemon_tls.cert_file else "on" if cfg.daemon_tls else "off",
    )


if __name__ == "__main__":
    sys.exit(main())
