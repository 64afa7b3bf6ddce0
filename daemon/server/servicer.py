"""`calculet.v1.Daemon` over `DeviceCore`: convert, call one method, convert back.

Runs on the grpc.aio event loop. Quick core calls (submit, cancel, status) run inline: they only
take the engine lock briefly. Blocking operations (load, unload, drain, reset) run in the default
thread pool. Wait streams follow a job's event log through a listener that wakes the loop with
`call_soon_threadsafe`; nothing polls.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

import grpc
from grpc_health.v1 import health_pb2
from grpc_health.v1.health import aio as health_aio  # type: ignore[attr-defined]  # untyped re-export

from calculet.daemon.core.device_core import DeviceCore
from calculet.daemon.core.events import FinalEvent
from calculet.daemon.core.model_state import ModelState
from calculet.daemon.core.models import LoadProgress
from calculet.daemon.errors import CalculetError, InvalidArgument
from calculet.daemon.server.errors import map_errors
from calculet.daemon.wire import event_to_pb, request_from_pb
from calculet.daemon.wire_views import (
    fault_from_pb,
    health_to_pb,
    load_report_to_pb,
    model_info_to_pb,
    progress_to_pb,
    status_to_pb,
)
from calculet.v1 import common_pb2, daemon_pb2_grpc, inference_pb2, observe_pb2, operate_pb2

log = logging.getLogger(__name__)

SERVICE_NAME = "calculet.v1.Daemon"
T = TypeVar("T")
_SERVING = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def _ms(value: int, present: bool) -> float | None:
    return value / 1000.0 if present else None


class DaemonServicer(daemon_pb2_grpc.DaemonServicer):
    """Thin translation layer; every RPC maps to one `DeviceCore` method."""

    def __init__(self, core: DeviceCore, health_servicer: health_aio.HealthServicer) -> None:
        self.core = core
        self.health = health_servicer

    async def _blocking(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(None, fn, *args)

    async def sync_health(self) -> None:
        """Publish overall and per-alias status on grpc.health.v1."""
        view = self.core.health()
        overall = _SERVING if view.serving else _NOT_SERVING
        await self.health.set("", overall)
        await self.health.set(SERVICE_NAME, overall)
        for m in view.models:
            await self.health.set(m.alias, _SERVING if view.serving and m.state.serving else _NOT_SERVING)

    # ---- inference plane ----------------------------------------------------------------

    @map_errors
    async def Submit(self, request: inference_pb2.SubmitRequest, context: grpc.aio.ServicerContext) -> Any:
        room = self.core.default_max_tokens(request.model) - len(request.prompt_tokens)
        req = request_from_pb(request, max(1, room))  # unset max_tokens: whatever room the prompt leaves
        result = self.core.submit(req)
        return inference_pb2.SubmitResponse(
            job_id=result.job_id, deduplicated=result.deduplicated, seed=result.seed, generation=result.generation
        )

    @map_errors
    async def Wait(self, request: inference_pb2.WaitRequest, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        log_ = self.core.event_log(request.job_id, for_wait=True)
        loop = asyncio.get_running_loop()
        changed = asyncio.Event()

        def wake() -> None:  # called on an engine thread
            loop.call_soon_threadsafe(changed.set)

        unsubscribe = log_.subscribe(wake)
        index = int(request.from_event_index)
        try:
            while True:
                changed.clear()
                events = log_.read(index)
                for event in events:
                    if isinstance(event, FinalEvent):
                        generation, recoveries = self.core.job_generation(request.job_id)
                        yield event_to_pb(event, generation, recoveries)
                        return
                    yield event_to_pb(event)
                index += len(events)
                if not events:
                    await changed.wait()
        finally:
            unsubscribe()

    @map_errors
    async def Cancel(self, request: inference_pb2.CancelRequest, context: grpc.aio.ServicerContext) -> Any:
        return inference_pb2.CancelResponse(already_finished=not self.core.cancel(request.job_id))

    # ---- observation plane --------------------------------------------------------------

    @map_errors
    async def Health(self, request: observe_pb2.HealthRequest, context: grpc.aio.ServicerContext) -> Any:
        await self.sync_health()
        return health_to_pb(self.core.health())

    @map_errors
    async def Status(self, request: observe_pb2.StatusRequest, context: grpc.aio.ServicerContext) -> Any:
        return status_to_pb(self.core.status())

    @map_errors
    async def WatchLoad(
        self, request: observe_pb2.WatchLoadRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Any]:
        interval = max(0.05, (request.interval_ms or 1000) / 1000.0)
        for sequence in itertools.count():
            yield load_report_to_pb(self.core.load_report(), sequence, time.time())
            await asyncio.sleep(interval)

    @map_errors
    async def GetModel(self, request: observe_pb2.GetModelRequest, context: grpc.aio.ServicerContext) -> Any:
        return model_info_to_pb(self.core.get_model(request.alias))

    # ---- operations plane ---------------------------------------------------------------

    @map_errors
    async def Load(self, request: operate_pb2.LoadRequest, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[LoadProgress] = asyncio.Queue()
        started = time.monotonic()

        def progress(p: LoadProgress) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, p)

        task = loop.run_in_executor(
            None, self.core.load, request.alias, request.package, progress, request.options.replace
        )
        last: LoadProgress | None = None
        while True:  # stream progress until the load returns or raises
            getter: asyncio.Future[Any] = asyncio.ensure_future(queue.get())
            waiting: set[asyncio.Future[Any]] = {getter, task}
            done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            if getter not in done:
                getter.cancel()
                break
            last = getter.result()
            yield progress_to_pb(last, time.monotonic() - started)
        while not queue.empty():  # progress that raced the result
            last = queue.get_nowait()
            yield progress_to_pb(last, time.monotonic() - started)
        exc = task.exception()
        if exc is not None:
            if last is None or not isinstance(exc, CalculetError):
                raise exc  # refused before it started (a plain status), or a bug (INTERNAL)
            if not last.done:  # a failure the progress stream has not reported yet
                failed = LoadProgress(request.alias, last.generation, ModelState.FAILED, str(exc), True, exc.kind)
                yield progress_to_pb(failed, time.monotonic() - started)
        await self.sync_health()

    @map_errors
    async def Unload(self, request: operate_pb2.UnloadRequest, context: grpc.aio.ServicerContext) -> Any:
        timeout = _ms(request.drain_timeout_ms, request.HasField("drain_timeout_ms"))
        generation = await self._blocking(self.core.unload, request.alias, timeout)
        await self.sync_health()
        return operate_pb2.UnloadResponse(generation=generation)

    @map_errors
    async def Drain(self, request: operate_pb2.DrainRequest, context: grpc.aio.ServicerContext) -> Any:
        timeout = _ms(request.timeout_ms, request.HasField("timeout_ms"))
        self.core.stop_admitting()
        await self.sync_health()  # NOT_SERVING as soon as admission stops, before the wait ends
        drained, remaining, interrupted = await self._blocking(
            self.core.wait_drained, timeout, request.interrupt_remaining
        )
        await self.sync_health()
        return operate_pb2.DrainResponse(drained=drained, remaining_jobs=remaining, interrupted_jobs=interrupted)

    @map_errors
    async def Resume(self, request: operate_pb2.ResumeRequest, context: grpc.aio.ServicerContext) -> Any:
        was = self.core.resume()
        await self.sync_health()
        return operate_pb2.ResumeResponse(was_draining=was)

    @map_errors
    async def Reset(self, request: operate_pb2.ResetRequest, context: grpc.aio.ServicerContext) -> Any:
        kinds = {common_pb2.RESET_KIND_CCU: "ccu", common_pb2.RESET_KIND_CONFIGURATION: "configuration"}
        kind = kinds.get(request.kind)
        if kind is None:
            raise InvalidArgument("reset kind: must be CCU or CONFIGURATION (device resets need a process restart)")
        started = time.monotonic()
        before = self.core.health()
        ok, message = await self._blocking(self.core.reset, kind, request.reason)
        after = self.core.health()
        await self.sync_health()
        return operate_pb2.ResetResult(
            ok=ok,
            kind=request.kind,
            reason=message,
            health_before=health_to_pb(before).status,
            health_after=health_to_pb(after).status,
            duration_s=time.monotonic() - started,
        )

    @map_errors
    async def InjectFault(self, request: operate_pb2.InjectFaultRequest, context: grpc.aio.ServicerContext) -> Any:
        if request.clear_existing:
            self.core.clear_faults()
        if request.HasField("fault"):
            self.core.inject_fault(fault_from_pb(request.fault))
        return operate_pb2.InjectFaultResponse(
            next_job_index=self.core.next_job_index(), planned_faults=self.core.planned_faults()
        )


__all__ = ["SERVICE_NAME", "CalculetError", "DaemonServicer"]
