"""Assemble and run the gRPC server: Daemon service, grpc.health.v1, reflection, listen target.

`serve` owns the asyncio side of the process: it starts the server on a Unix socket or TCP
address, publishes health (readiness; liveness from the engine heartbeat: `liveness.py`), waits for
a stop signal, then drains gracefully: admission stops (readiness NOT_SERVING, liveness stays
SERVING), running jobs get `grace_s` to finish, every job still unfinished then ends with
an in-band Final ERROR / UNAVAILABLE (a gateway resumes it on another board with resume_tokens),
the server stops once the Wait streams have sent those, and the core closes without waiting for a
device job that hangs. The same stop runs when the board asks to exit because its device stayed
unhealthy after a reset (`DeviceCore.on_exit_request`; the process then exits EXIT_DEVICE_UNHEALTHY).
Under systemd (`sd_notify`) it sends READY=1 once it listens, STATUS= lines as
the board's state changes, WATCHDOG=1 from the engine thread's loop, STOPPING=1 on SIGTERM before the
drain, and RELOADING=1 ... READY=1 around a SIGHUP, which runs the caller's `reload` in a worker
thread. A Unix socket is only ever taken over from a dead daemon, and removed at the end only while
it is still this process's (`ownership`).

Transport bounds: the receive limit defaults to the largest valid request for a 40,960-token context
(`checks.request_bytes`, 279,568 bytes), so a prompt far beyond any context is refused by grpc before
it is parsed; the send limit is gRPC's default receive limit, so no answer is larger than a stock
client takes (GetModel streams the tokenizer in pieces well below it). Every method
answers INVALID_ARGUMENT for a request that does not parse (`errors.StrictDecoding`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio  # type: ignore[attr-defined]  # untyped re-export
from grpc_reflection.v1alpha import reflection

from calculet.common.errors import InvalidArgument
from calculet.common.sd_notify import Notifier
from calculet.daemon.core.device_core import DeviceCore
from calculet.daemon.server.access import BearerAuth, ServerSecurity
from calculet.daemon.server.checks import REFERENCE_CONTEXT, request_bytes
from calculet.daemon.server.errors import StrictDecoding
from calculet.daemon.server.ownership import (
    SocketIdentity,
    bind_unix,
    check_socket_path,
    directory_lock,
    remove_own_socket,
)
from calculet.daemon.server.servicer import SERVICE_NAME, DaemonServicer
from calculet.v1 import daemon_pb2_grpc

log = logging.getLogger(__name__)

DEFAULT_MAX_MESSAGE_BYTES = request_bytes(REFERENCE_CONTEXT)  # what a client may send: 279,568 bytes
MAX_SEND_BYTES = 4 * 1024 * 1024  # what the daemon may send: a stock client's receive limit
# Calls gRPC holds before the servicer takes them. Past its bound (1,000 by default) gRPC cancels new
# calls itself: a burst of 1,200 Submits got CANCELLED, which a client reads as its own cancel (a
# gateway answered a 3,000-prompt request 499). Far above the admission bound (lanes + queue), so the
# daemon's own typed refusal, RESOURCE_EXHAUSTED with a retry hint, is what a burst meets.
MAX_PENDING_RPCS = 16384
STOP_GRACE_S = 2.0  # for RPCs still running at shutdown: Wait streams send their last Final meanwhile
SHUTDOWN_REASON = "board shutting down: resume on another board"
STATUS_FOLLOW_S = 3600.0  # the STATUS= follower re-checks at least this often (it wakes on every change)


def normalize_target(listen: str) -> str:
    """`unix:PATH`, `unix:///ABS`, `HOST:PORT`, or a bare path ending in `.sock` -> a grpc address.

    Raises:
        InvalidArgument: empty target.
    """
    if not listen:
        raise InvalidArgument("listen: must not be empty")
    if listen.startswith("unix:"):
        return listen
    if listen.endswith(".sock") or listen.startswith(("/", "./")):
        return f"unix:{listen}"
    return listen


def unix_path(target: str) -> Path | None:
    if not target.startswith("unix:"):
        return None
    rest = target[len("unix:") :]
    return Path(rest[2:] if rest.startswith("//") else rest)


def check_listen(listen: str) -> None:
    """Fail fast, before the device is opened, on a Unix socket path `serve` would refuse (it removes
    nothing: a stale socket is removed by `serve`, under the directory lock).

    Raises:
        InvalidArgument: empty target, a non-socket file on the path, or a socket of unknown liveness.
        SocketInUse: a live process listens on the path.
    """
    sock = unix_path(normalize_target(listen))
    if sock is not None:
        check_socket_path(sock)


async def serve(
    core: DeviceCore,
    listen: str,
    *,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    grace_s: float = 30.0,
    ready: asyncio.Event | None = None,
    announce: bool = True,
    notifier: Notifier | None = None,
    reload: Callable[[], None] | None = None,
    security: ServerSecurity | None = None,
    health_listen: str | None = None,
) -> None:
    """Run until SIGTERM/SIGINT (or `core` is closed by the caller).

    `health_listen` (HOST:PORT): a second, plaintext listener serving only grpc.health.v1, for
    probes that cannot speak TLS (Kubernetes' gRPC probes): readiness (`""`, per alias) and liveness
    (`calculet.liveness`), both published by the servicer on the one health servicer.

    `security`: bearer tokens per access plane, TLS for TCP (plain TCP only with `insecure`), the
    Unix socket's mode (default: open planes, TLS required on TCP, socket 0660).

    `notifier` tells systemd (see the module docstring; None: nobody). `reload` (blocking, run in a
    worker thread) is what SIGHUP does; without it SIGHUP keeps its default action.

    A Unix socket path is replaced only if nothing listens on it (a stale socket from a killed
    daemon), and removed at the end only if it is still the socket this call bound
    (`ownership.bind_unix`, `ownership.remove_own_socket`).

    Raises:
        InvalidArgument: the listen target is empty, cannot be created or bound, or a non-socket
            file is in the way.
        SocketInUse: a live process listens on the Unix socket path.
    """
    target = normalize_target(listen)
    sock = unix_path(target)
    if sock is not None:
        try:
            sock.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise InvalidArgument(f"listen: cannot create {sock.parent}: {exc.strerror}") from None
    options = [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", MAX_SEND_BYTES),
        ("grpc.so_reuseport", 0),
        ("grpc.server.max_pending_requests", MAX_PENDING_RPCS),
        ("grpc.server.max_pending_requests_hard_limit", 2 * MAX_PENDING_RPCS),
    ]
    security = security or ServerSecurity()
    interceptors: list[grpc.aio.ServerInterceptor] = [StrictDecoding()]
    if security.policy.enabled:
        interceptors.insert(0, BearerAuth(security.policy))  # refuse before anything is parsed
    credentials = security.tcp_credentials(target) if sock is None else None
    server = grpc.aio.server(options=options, interceptors=interceptors)
    health_servicer = health_aio.HealthServicer()
    servicer = DaemonServicer(core, health_servicer)
    daemon_pb2_grpc.add_DaemonServicer_to_server(servicer, server)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    probes = _probe_server(health_servicer, health_listen) if health_listen else None
    reflection.enable_server_reflection([SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME], server)

    def bind(address: str) -> None:
        try:
            if credentials is not None:
                server.add_secure_port(address, credentials)
            else:
                server.add_insecure_port(address)
        except RuntimeError:  # grpc's only report of a failed bind
            raise InvalidArgument(
                f"listen: cannot bind {target} (address in use, not resolvable or not permitted)"
            ) from None

    identity: SocketIdentity | None = None
    if sock is not None:
        with directory_lock(sock.parent):
            identity = bind_unix(sock, lambda private: bind(f"unix:{private}"))
            sock.chmod(security.socket_mode)  # owner and group only: the socket is the access boundary
    else:
        bind(target)
        if credentials is None:
            log.warning("listening on TCP %s without TLS (--insecure): use it on trusted networks only", target)
    try:
        if probes is not None:
            await probes.start()
        notices = notifier or Notifier(None)
        await _run(core, server, servicer, target, grace_s, max_message_bytes, ready, announce, notices, reload)
    finally:
        if probes is not None:
            await probes.stop(grace=None)
        if sock is not None and identity is not None:
            with directory_lock(sock.parent):
                remove_own_socket(sock, identity)


def _probe_server(health_servicer: health_aio.HealthServicer, listen: str) -> grpc.aio.Server:
    """A plaintext server with grpc.health.v1 only (the same statuses as the main listener, liveness
    included).

    Raises:
        InvalidArgument: the address cannot be bound.
    """
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    try:
        server.add_insecure_port(listen)
    except RuntimeError:
        raise InvalidArgument(f"health_listen: cannot bind {listen}") from None
    return server


async def _run(
    core: DeviceCore,
    server: grpc.aio.Server,
    servicer: DaemonServicer,
    target: str,
    grace_s: float,
    max_message_bytes: int,
    ready: asyncio.Event | None,
    announce: bool,
    notifier: Notifier,
    reload: Callable[[], None] | None,
) -> None:
    """Start `server`, serve until a stop signal, then drain and stop (see the module docstring)."""
    await server.start()
    await servicer.sync_health()
    _warn_if_too_small(core, max_message_bytes)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # The device stayed unhealthy after a reset: stop as on SIGTERM; main exits EXIT_DEVICE_UNHEALTHY.
    core.on_exit_request(lambda _reason: _call_soon(loop, stop.set))
    if core.exit_reason:  # asked before the loop listened
        stop.set()
    if announce:
        models = ", ".join(f"{m.alias} (generation {m.generation})" for m in core.health().models) or "none"
        log.info("board %d serving on %s; models: %s", core.config.board, target, models)
    if ready is not None:
        ready.set()
    tasks = _tell_systemd(core, servicer, target, notifier, reload, stop)
    await stop.wait()
    if core.exit_reason:
        log.error("exiting for a restart: %s", core.exit_reason)
    log.info("stopping: draining for up to %.0fs", grace_s)
    notifier.stopping(f"draining for up to {grace_s:.0f}s")
    for task in tasks:
        task.cancel()
    core.stop_admitting("shutdown")
    await servicer.sync_health()
    await loop.run_in_executor(None, core.wait_drained, grace_s, False)
    # In-band Finals now, hung device jobs included: the gateway resumes them elsewhere.
    ended = await loop.run_in_executor(None, core.end_unfinished, SHUTDOWN_REASON)
    if ended:
        log.warning("shutdown: %d job(s) unfinished after %.0fs ended with UNAVAILABLE", ended, grace_s)
    await server.stop(grace=STOP_GRACE_S)
    servicer.close()
    await loop.run_in_executor(None, core.close)


def _call_soon(loop: asyncio.AbstractEventLoop, callback: Callable[[], None]) -> None:
    """Run `callback` on `loop` from any thread (a loop already closed: nothing left to stop)."""
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(callback)


def _tell_systemd(
    core: DeviceCore,
    servicer: DaemonServicer,
    target: str,
    notifier: Notifier,
    reload: Callable[[], None] | None,
    stop: asyncio.Event,
) -> list[asyncio.Task[None]]:
    """READY=1 now; then WATCHDOG=1 from the engine thread's loop, a STATUS= line whenever the board's
    state changes (the engine's own health changes and every change `servicer.sync_health` sees), and
    RELOADING=1 ... READY=1 around SIGHUP (if there is a `reload`). Returns the tasks to cancel at stop."""
    loop = asyncio.get_running_loop()
    last = [_status_line(core, target)]
    notifier.ready(last[0])
    if notifier.enabled and notifier.watchdog_s is not None:
        core.on_heartbeat(notifier.watchdog, notifier.watchdog_s)

    def publish() -> None:
        line = _status_line(core, target)
        if line != last[0] and not stop.is_set():
            last[0] = line
            notifier.status(line)

    def board_changed() -> None:  # on an engine thread, under its lock: only hand over to the loop
        with contextlib.suppress(RuntimeError):  # the loop is closed: the process is exiting
            loop.call_soon_threadsafe(publish)

    async def follow() -> None:
        while True:
            seen = servicer.changes.version
            await servicer.changes.wait(seen, STATUS_FOLLOW_S)
            publish()

    async def reload_now() -> None:
        assert reload is not None
        notifier.reloading("reloading the configuration")
        try:
            await loop.run_in_executor(None, reload)
        except Exception:
            log.exception("SIGHUP: reload failed")
        await servicer.sync_health()
        if not stop.is_set():
            last[0] = _status_line(core, target)
            notifier.ready(last[0])

    tasks: list[asyncio.Task[None]] = []  # the STATUS= follower, and the reload if one runs

    def hangup() -> None:
        if stop.is_set():
            return
        if any(t.get_name() == "reload" and not t.done() for t in tasks):
            log.warning("SIGHUP: a reload is still running; ignored")
            return
        tasks[:] = [t for t in tasks if not t.done()]
        tasks.append(loop.create_task(reload_now(), name="reload"))

    if notifier.enabled:
        core.on_health_change(board_changed)
        tasks.append(loop.create_task(follow()))
    if reload is not None:
        loop.add_signal_handler(signal.SIGHUP, hangup)
    return tasks


def _status_line(core: DeviceCore, target: str) -> str:
    view = core.health()
    models = ", ".join(f"{m.alias} {m.state.name} (generation {m.generation})" for m in view.models) or "none"
    state = "serving" if view.serving else f"not serving ({view.reason})"
    return f"{state} on {target}; models: {models}"


def _warn_if_too_small(core: DeviceCore, max_message_bytes: int) -> None:
    """A loaded model whose full-context requests the receive limit would refuse: say which flag fixes it."""
    need = request_bytes(core.largest_context())
    if max_message_bytes < need:
        log.warning(
            "--max-message-bytes %d refuses full-context requests to the largest model loaded (%d tokens "
            "need %d bytes)", max_message_bytes, core.largest_context(), need,
        )  # fmt: skip
