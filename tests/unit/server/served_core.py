"""`ServedCore`: a `DeviceCore` behind the real servicer and grpc.health.v1, on an in-process grpc.aio
server on a Unix socket, for transport tests that need exact status codes without a daemon process."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2_grpc
from grpc_health.v1.health import aio as health_aio  # type: ignore[attr-defined]  # untyped re-export

from calculet.daemon.core.device_core import DeviceCore
from calculet.daemon.server.liveness import LivenessPolicy
from calculet.daemon.server.servicer import DaemonServicer
from calculet.v1 import daemon_pb2_grpc

CALL_S = 20.0  # deadline of every call that a defect could leave hanging


class ServedCore:
    """A `DeviceCore` behind the real servicer and grpc.health.v1, on a loop thread of its own.

    Args:
        core: a started core; owned (and closed) by this object from now on.
        sock: the Unix socket path to serve on.
        liveness: the servicer's liveness policy (None: the daemon's, from the core's job timeout).
    """

    def __init__(self, core: DeviceCore, sock: Path, liveness: LivenessPolicy | None = None) -> None:
        self.core = core
        self._liveness = liveness
        self.target = f"unix:{sock}"
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="review-server", daemon=True)
        self._thread.start()
        self._server: grpc.aio.Server | None = None
        self._run(self._start())
        self.channel = grpc.insecure_channel(self.target)
        self.stub = daemon_pb2_grpc.DaemonStub(self.channel)
        self.health = health_pb2_grpc.HealthStub(self.channel)

    def _run(self, coro: Coroutine[Any, Any, None]) -> None:
        asyncio.run_coroutine_threadsafe(coro, self._loop).result(CALL_S)

    async def _start(self) -> None:
        self._server = grpc.aio.server()
        health = health_aio.HealthServicer()
        servicer = DaemonServicer(self.core, health, self._liveness)
        daemon_pb2_grpc.add_DaemonServicer_to_server(servicer, self._server)
        health_pb2_grpc.add_HealthServicer_to_server(health, self._server)
        self._server.add_insecure_port(self.target)
        await self._server.start()
        await servicer.sync_health()

    def close(self) -> None:
        self.channel.close()
        assert self._server is not None
        self._run(self._server.stop(None))
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(CALL_S)
        self._loop.close()
        self.core.close()
