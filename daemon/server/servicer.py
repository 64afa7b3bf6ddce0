"""`calculet.v1.Daemon` over `DeviceCore`: convert, call one method, convert back.

Runs on the grpc.aio event loop. Quick core calls (submit, cancel, status) run inline: they only
take the engine lock briefly. Submit's size checks are O(1) and come first; a request of more than
`INLINE_TOKENS` tokens is then converted, checked (O(tokens)) and submitted on a small pool of its
own, so neither the loop nor the engine lock waits for a large prompt and no long operator call can
starve it (smaller ones cost less than the thread hop and stay inline). Blocking operations
(load, unload, drain, reset, GetModel's file reads) run in the default thread pool. Wait streams
follow a job's event log through a listener that wakes the loop with `call_soon_threadsafe`;
WatchLoad streams sleep until their interval or a board-state change (`changes.StateChanges`, fed by
`sync_health`); nothing polls. `sync_health` publishes readiness (`""`, `SERVICE_NAME`, each alias)
and liveness (`liveness.LIVENESS_SERVICE`: the engine heartbeat, checked again by a loop timer set
for the moment the last beat would grow too old). Request checks that only the wire defines (drain
windows, WatchLoad interval, Reset fields, job id lengths: `checks.py`; the Wait index here) come
before any core call, so a refused request changes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import grpc
from grpc_health.v1 import health_pb2
from grpc_health.v1.health import aio as health_aio  # type: ignore[attr-defined]  # untyped re-export

from calculet.common.errors import CalculetError, InvalidArgument
from calculet.daemon.core.audit import OPERATOR_DRAIN
from calculet.daemon.core.device_core import DeviceCore, SubmitReceipt
from calculet.daemon.core.events import EventLog, FinalEvent, FinishReason
from calculet.daemon.core.model_state import ModelState
from calculet.daemon.core.models import LoadProgress
from calculet.daemon.core.observe.status import HealthView
from calculet.daemon.core.request import CheckedRequest, GenerationRequest, ModelLimits, RequestTrace, prevalidate
from calculet.daemon.server.changes import StateChanges, signature
from calculet.daemon.server.checks import (
    REFERENCE_CONTEXT,
    constraint_sizes,
    drain_window_s,
    job_id,
    package_path,
    reset_kind,
    stop_token,
    thinking_range,
    wait_start,
    watch_interval_s,
)
from calculet.daemon.server.errors import map_errors
from calculet.daemon.server.follow import FollowSession
from calculet.daemon.server.liveness import LIVENESS_SERVICE, EngineBeats, LivenessPolicy, needs_restart
from calculet.daemon.server.load_notices import LoadNotices
from calculet.daemon.server.wakeups import LoopWakeups
from calculet.daemon.wire import (
    check_submit_sizes,
    event_to_pb,
    follow_reply_to_pb,
    request_from_pb,
    switch_from_pb,
    trace_from_metadata,
)
from calculet.daemon.wire_views import (
    fault_from_pb,
    health_to_pb,
    load_report_to_pb,
    model_info_to_pb,
    progress_to_pb,
    reset_result_to_pb,
    status_to_pb,
)
from calculet.v1 import daemon_pb2_grpc, inference_pb2, observe_pb2, operate_pb2

log = logging.getLogger(__name__)

SERVICE_NAME = "calculet.v1.Daemon"
RESERVED_SERVICES = frozenset({"", SERVICE_NAME, LIVENESS_SERVICE})  # never published as model aliases
T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])
_SERVING = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SUBMIT_WORKERS = 2  # the GIL serialises the conversions anyway; two let one wait on the engine lock
# Up to this many prompt + resume tokens a Submit is converted and checked on the loop: ~0.1 ms of
# work, less than a hop to a worker thread and back costs on a busy 2-core board (~0.5 ms measured).
INLINE_TOKENS = 1024


def _counts_refusals(submit: F) -> F:
    """Count every Submit that ends in an error, of any kind, in JobCounters.rejected (observe.proto):
    the transport is the one place that sees them all, the wire checks' refusals included."""

    @functools.wraps(submit)
    async def counted(self: DaemonServicer, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await submit(self, request, context)
        except Exception:
            self.core.count_rejected()
            raise

    return counted  # type: ignore[return-value]


class DaemonServicer(daemon_pb2_grpc.DaemonServicer):
    """Thin translation layer; every RPC maps to one `DeviceCore` method."""

    def __init__(
        self, core: DeviceCore, health_servicer: health_aio.HealthServicer, liveness: LivenessPolicy | None = None
    ) -> None:
        self.core = core
        self.health = health_servicer
        self.changes = StateChanges()
        self._background: set[asyncio.Task[None]] = set()  # sync_health after loads whose caller left
        self._published: set[str] = set()  # aliases sync_health last published on grpc.health.v1
        self._clashing: set[str] = set()  # aliases spelled like RESERVED_SERVICES (never published)
        self._sync_lock = asyncio.Lock()
        # Owned here, shut down by `close`: Submit's conversion and core call.
        self._submit_pool = ThreadPoolExecutor(SUBMIT_WORKERS, thread_name_prefix="calculet-submit")
        # The engine stops serving on its own (device lost, reset budget used up): publish at once.
        loop = asyncio.get_running_loop()
        self._wakeups = LoopWakeups(loop)  # Wait streams' wake-ups, one loop wake per burst

        def board_changed() -> None:  # on an engine thread
            loop.call_soon_threadsafe(self._sync_in_background)

        core.on_health_change(board_changed)
        # A finished request parks or frees a lane: routers hear of it within 50 ms, not an interval.
        self._load_notices = LoadNotices(loop, self.changes)
        core.engine.add_observer(self._load_notices)
        self._start_liveness(loop, liveness or LivenessPolicy.for_job_timeout(core.config.job_timeout_s))

    def _start_liveness(self, loop: asyncio.AbstractEventLoop, policy: LivenessPolicy) -> None:
        """Follow the engine heartbeat for `LIVENESS_SERVICE` (see `liveness.py`): the first beat after
        a silence wakes the loop; `_arm_liveness` sets the timer for the next possible silence."""
        self._beats = EngineBeats(policy.timeout_s)
        self._liveness_timer: asyncio.TimerHandle | None = None
        self._closed = False

        def engine_beat() -> None:  # on the engine thread, under its lock: never blocks
            if self._beats.beat() and not self._closed:
                with contextlib.suppress(RuntimeError):  # the loop is closed: the process is exiting
                    loop.call_soon_threadsafe(self._sync_in_background)

        self.core.on_heartbeat(engine_beat, policy.beat_s)

    def _arm_liveness(self) -> None:
        """Sync again when the last engine beat grows too old (no timer while it already is: the
        next beat wakes the loop)."""
        if self._liveness_timer is not None:
            self._liveness_timer.cancel()
            self._liveness_timer = None
        left = self._beats.expires_in()
        if left > 0 and not self._closed:
            self._liveness_timer = asyncio.get_running_loop().call_later(left, self._sync_in_background)

    async def _blocking(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(None, fn, *args)

    def close(self) -> None:
        """Stop Submit's worker threads (after the server stopped; a running conversion finishes) and
        the liveness timer."""
        self._closed = True
        self._load_notices.close()
        if self._liveness_timer is not None:
            self._liveness_timer.cancel()
        self._submit_pool.shutdown(wait=False, cancel_futures=True)

    async def sync_health(self) -> None:
        """Publish readiness (overall and per alias) and liveness on grpc.health.v1; wake WatchLoad
        streams on a change.

        An alias that was published before and is gone now (unloaded) reads NOT_SERVING. An alias
        spelled like one of the board's own service names is not published (it would overwrite it).
        Liveness (`LIVENESS_SERVICE`) reads SERVING unless the engine thread is silent too long or
        the board needs a restart (`liveness.py`). Serialised, so an older view never overwrites a
        newer one.
        """
        async with self._sync_lock:
            view = self.core.health()
            self.changes.observe(signature(view))
            alive = self._beats.expires_in() > 0 and not needs_restart(self.core, view)
            await self.health.set(LIVENESS_SERVICE, _SERVING if alive else _NOT_SERVING)
            self._arm_liveness()
            overall = _SERVING if view.serving else _NOT_SERVING
            await self.health.set("", overall)
            await self.health.set(SERVICE_NAME, overall)
            current = self._aliases_to_publish(view)
            for m in view.models:
                if m.alias in current:
                    await self.health.set(m.alias, _SERVING if view.serving and m.state.serving else _NOT_SERVING)
            for alias in self._published - current:
                await self.health.set(alias, _NOT_SERVING)
            self._published = current

    def _aliases_to_publish(self, view: HealthView) -> set[str]:
        """The view's aliases but those spelled like a service name of the board (warned once each)."""
        aliases = {m.alias for m in view.models}
        clashing = aliases & RESERVED_SERVICES
        for alias in sorted(clashing - self._clashing):
            log.warning("model alias %r is also a grpc.health.v1 service name of the board: not published", alias)
        self._clashing = clashing
        return aliases - clashing

    # ---- inference plane ----------------------------------------------------------------

    @map_errors
    @_counts_refusals
    async def Submit(self, request: inference_pb2.SubmitRequest, context: grpc.aio.ServicerContext) -> Any:
        limits = self.core.serving_limits(request.model)
        # A model that does not serve now is refused by the core; bound its prompt by what any could take.
        bound = limits.context if limits is not None else max(self.core.largest_context(), REFERENCE_CONTEXT)
        check_submit_sizes(request, bound)  # O(1), before any token id is read
        constraint_sizes(request.sampling)
        thinking_range(request.sampling)
        trace = trace_from_metadata(context.invocation_metadata())
        # A constraint may compile (milliseconds, and the tokenizer's first build about a second): never
        # on the event loop.
        small = len(request.prompt_tokens) + len(request.resume_tokens) <= INLINE_TOKENS
        if small and not request.sampling.HasField("constraint"):
            result = self._submit_checked(request, limits, trace)
        else:
            loop = asyncio.get_running_loop()
            result = await loop.run_in_executor(self._submit_pool, self._submit_checked, request, limits, trace)
        return inference_pb2.SubmitResponse(
            job_id=result.job_id, deduplicated=result.deduplicated, seed=result.seed, generation=result.generation
        )

    def _submit_checked(
        self, request: inference_pb2.SubmitRequest, limits: ModelLimits | None, trace: RequestTrace
    ) -> SubmitReceipt:
        """Convert, check (O(tokens), outside the engine lock) and submit a request."""
        req = _checked_request(request, limits, trace)
        return self.core.submit(req, seed_given=request.sampling.HasField("seed"))

    @map_errors
    async def Wait(self, request: inference_pb2.WaitRequest, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        log_ = self.core.event_log(job_id(request.job_id), for_wait=True)
        index = wait_start(log_, request.job_id, int(request.from_event_index))
        changed = asyncio.Event()

        def wake() -> None:  # called on an engine thread
            self._wakeups.wake(changed)

        unsubscribe = log_.subscribe(wake)
        try:
            while True:
                changed.clear()
                events = log_.read(index)
                for event in events:
                    if isinstance(event, FinalEvent):
                        yield event_to_pb(event, *self._final_extras(request.job_id, log_, event))
                        return
                    yield event_to_pb(event)
                index += len(events)
                if not events:
                    if log_.finished:  # attached after the Final: nothing is left to send
                        return
                    await changed.wait()
        finally:
            unsubscribe()

    @map_errors
    async def Follow(
        self, requests: AsyncIterator[inference_pb2.FollowRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Any]:
        await context.send_initial_metadata(())  # clients write their first attach once they see it
        changed = asyncio.Event()
        session = FollowSession(
            lambda job: self.core.event_log(job_id(job), for_wait=True), lambda: self._wakeups.wake(changed)
        )
        reader = asyncio.ensure_future(_apply_follow_requests(requests, session, changed))
        try:
            while True:
                changed.clear()
                updates = session.collect()
                if updates:
                    yield follow_reply_to_pb(updates, self._final_extras)
                    continue
                if reader.done():
                    reader.result()  # a bad request fails the stream; the client's half-close ends it
                    if not session.attached:
                        return
                await changed.wait()
        finally:
            reader.cancel()
            session.close()

    def _final_extras(self, job: str, log_: EventLog, final: FinalEvent) -> tuple[int, int, int | None]:
        """What a Final carries beyond the event: model generation, recoveries, stop token."""
        generation, recoveries = self.core.job_generation(job)
        return generation, recoveries, stop_token(log_) if final.reason is FinishReason.STOP else None

    @map_errors
    async def Cancel(self, request: inference_pb2.CancelRequest, context: grpc.aio.ServicerContext) -> Any:
        return inference_pb2.CancelResponse(already_finished=not self.core.cancel(job_id(request.job_id)))

    # ---- observation plane --------------------------------------------------------------

    @map_errors
    async def Health(self, request: observe_pb2.HealthRequest, context: grpc.aio.ServicerContext) -> Any:
        await self.sync_health()
        return health_to_pb(self.core.health())

    @map_errors
    async def Status(self, request: observe_pb2.StatusRequest, context: grpc.aio.ServicerContext) -> Any:
        # Device queries (memory, counters) and one manifest read per generation: off the event loop.
        return status_to_pb(await self._blocking(self.core.status))

    @map_errors
    async def WatchLoad(
        self, request: observe_pb2.WatchLoadRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Any]:
        interval_s = watch_interval_s(request.interval_ms)
        await self.sync_health()  # the first report and later changes start from the current state
        for sequence in itertools.count():
            seen = self.changes.version
            healthy = self.core.health().device_healthy
            yield load_report_to_pb(self.core.load_report(), sequence, time.time(), healthy)
            await self.changes.wait(seen, interval_s)

    @map_errors
    async def GetModel(
        self, request: observe_pb2.GetModelRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Any]:
        info = await self._blocking(self.core.get_model, request.alias)  # reads the tokenizer file
        for message in model_info_to_pb(info):  # tokenizer.json in pieces below gRPC's 4 MiB default
            yield message

    # ---- operations plane ---------------------------------------------------------------

    @map_errors
    async def Load(self, request: operate_pb2.LoadRequest, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        options = request.options
        drain_s = drain_window_s(
            "options.drain_timeout_ms", options.drain_timeout_ms, options.HasField("drain_timeout_ms")
        )
        lanes = options.lanes if options.HasField("lanes") else None
        switch = switch_from_pb(options)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[LoadProgress] = asyncio.Queue()
        started = time.monotonic()

        def progress(p: LoadProgress) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, p)

        package = package_path(request.package)
        task = loop.run_in_executor(
            None, self.core.load, request.alias, package, progress, options.replace, lanes, drain_s, switch
        )
        # The load goes on if the caller leaves (operate.proto): health is published when it ends.
        task.add_done_callback(self._load_ended)
        last: LoadProgress | None = None
        getter: asyncio.Future[Any] | None = None
        try:
            while True:  # stream progress until the load returns or raises
                getter = asyncio.ensure_future(queue.get())
                waiting: set[asyncio.Future[Any]] = {getter, task}
                done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                if getter not in done:
                    break
                last = getter.result()
                yield progress_to_pb(last, time.monotonic() - started)
        finally:
            if getter is not None:
                getter.cancel()
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

    def _load_ended(self, task: asyncio.Future[Any]) -> None:
        """On the loop when a load returns, whether or not its caller still listens."""
        exc = None if task.cancelled() else task.exception()  # retrieved even if nobody streams it
        if isinstance(exc, CalculetError):
            log.info("load refused or failed: %s", exc)
        elif exc is not None:
            log.error("load crashed", exc_info=exc)
        self._sync_in_background()

    def _sync_in_background(self) -> None:
        """Schedule `sync_health` on the loop (kept referenced until done)."""
        sync = asyncio.ensure_future(self.sync_health())
        self._background.add(sync)
        sync.add_done_callback(self._background.discard)

    @map_errors
    async def Unload(self, request: operate_pb2.UnloadRequest, context: grpc.aio.ServicerContext) -> Any:
        timeout = drain_window_s("drain_timeout_ms", request.drain_timeout_ms, request.HasField("drain_timeout_ms"))
        retired = await self._blocking(self.core.unload, request.alias, timeout)
        await self.sync_health()
        return operate_pb2.UnloadResponse(
            generation=retired.generation,
            drained_jobs=retired.drained_jobs,
            interrupted_jobs=retired.interrupted_jobs,
        )

    @map_errors
    async def Drain(self, request: operate_pb2.DrainRequest, context: grpc.aio.ServicerContext) -> Any:
        timeout = drain_window_s("timeout_ms", request.timeout_ms, request.HasField("timeout_ms"))
        self.core.stop_admitting(OPERATOR_DRAIN)
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
        kind = reset_kind(request, lambda alias: self.core.models.published(alias) is not None)
        started = time.monotonic()
        before = self.core.health()
        # Another reset in progress: FailedPrecondition; a failed attempt is reported in the result.
        report = await self._blocking(self.core.operator_reset, kind, request.reason, request.model)
        after = self.core.health()
        c = report.counts
        (log.info if report.ok else log.error)(
            "operator %s reset (%s): %s; jobs hit %d, recovered %d, failed %d; serving %s -> %s",
            kind, request.reason, report.message, c.inflight, c.recovered, c.failed, before.serving, after.serving,
        )  # fmt: skip
        await self.sync_health()
        return reset_result_to_pb(report, request.reason, before, after, time.monotonic() - started)

    @map_errors
    async def InjectFault(self, request: operate_pb2.InjectFaultRequest, context: grpc.aio.ServicerContext) -> Any:
        fault = fault_from_pb(request.fault) if request.HasField("fault") else None  # refuse before clearing
        if request.clear_existing:
            self.core.clear_faults()
        if fault is not None:
            self.core.inject_fault(fault)
        return operate_pb2.InjectFaultResponse(
            next_job_index=self.core.next_job_index(), planned_faults=self.core.planned_faults()
        )


def _checked_request(
    request: inference_pb2.SubmitRequest, limits: ModelLimits | None, trace: RequestTrace
) -> GenerationRequest | CheckedRequest:
    """The domain request, checked against `limits` (when its model serves) off the engine lock."""
    room = (limits.context if limits is not None else 1) - len(request.prompt_tokens)
    req = request_from_pb(request, max(1, room), trace)  # unset max_tokens: whatever room the prompt leaves
    return prevalidate(req, limits) if limits is not None else req


__all__ = ["LIVENESS_SERVICE", "SERVICE_NAME", "CalculetError", "DaemonServicer"]


async def _apply_follow_requests(
    requests: AsyncIterator[inference_pb2.FollowRequest], session: FollowSession, changed: asyncio.Event
) -> None:
    """Feed a Follow stream's attach / detach requests to its session (until the client half-closes)."""
    try:
        async for request in requests:
            if request.HasField("attach"):
                wait = request.attach.wait
                session.attach(request.attach.follow_id, wait.job_id, int(wait.from_event_index))
            elif request.HasField("detach"):
                session.detach(request.detach)
            else:
                raise InvalidArgument("FollowRequest: set attach or detach")
    finally:
        changed.set()  # the stream loop sees the reader's end (or error)
