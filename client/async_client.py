"""`AsyncDaemonClient`: the asyncio (grpc.aio) client of one board daemon.

Same API and semantics as `calculet.client.sync_client.DaemonClient` (read its docstring for data
flow, deadlines and error mapping), with `async def` methods and async iterators for the server
streams. The requests, checks, conversions and the generation bookkeeping are the same modules
(`messages`, `convert`, `cursor`, `generation`, `errors`); only the I/O differs. This is the client
the gateway uses: importing it pulls in neither the daemon's engine nor numpy.

Ownership: the client owns its aio channel until `await close()`. Construct it inside the event
loop that uses it (the channel binds to the running loop); it is not meant to be shared across
loops. Async iterators it returns own their call and cancel it when closed (`aclose()`).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from typing import Any, TypeVar

import grpc
import grpc.aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from calculet.client.channel import ClientSettings, Target, TlsConfig, open_aio_channel, wait_ready_async
from calculet.client.convert import (
    event_from_pb,
    load_report_from_pb,
    model_info_from_stream,
    serving_status_from_health,
)
from calculet.client.errors import error_from_rpc
from calculet.client.follow_mux import FollowMux
from calculet.client.generation import DEFAULT_MAX_REATTACH, AsyncGeneration, WaitCursor
from calculet.client.messages import (
    SubmitResult,
    Switch,
    drain_request,
    inject_fault_request,
    load_outcome,
    load_request,
    operation_timeout,
    reset_request,
    submit_request,
    unload_request,
    wait_request,
    watch_load_request,
)
from calculet.client.state import ClientLife
from calculet.client.types import Event, LoadReport, ModelInfo, SamplingParams, ServingStatus
from calculet.v1 import daemon_pb2_grpc, inference_pb2, observe_pb2, operate_pb2

T = TypeVar("T")


class AsyncDaemonClient:
    """asyncio client of one daemon. Args and Raises as `DaemonClient`, and:

    Args:
        follow: `generate`'s streams share one Follow call (`client.follow_mux`: one message per
            decode step instead of one per job); False: one Wait stream per job.
    """

    def __init__(
        self,
        target: str,
        *,
        timeout: float = 30.0,
        token: str | None = None,
        max_reattach: int = DEFAULT_MAX_REATTACH,
        tls: TlsConfig | None = None,
        follow: bool = True,
    ) -> None:
        self._settings = ClientSettings.build(target, timeout=timeout, token=token, max_reattach=max_reattach, tls=tls)
        self._life = ClientLife(f"AsyncDaemonClient({target})")
        self._channel = open_aio_channel(self._settings.target, self._settings.tls)
        self._stub: Any = daemon_pb2_grpc.DaemonStub(self._channel)
        self._health_stub: Any = health_pb2_grpc.HealthStub(self._channel)
        # generate()'s streams share one Follow call (one message per decode step, not per job).
        self._follow = (
            FollowMux(lambda: self._stub.Follow(metadata=self._settings.metadata), self._open_wait) if follow else None
        )

    @property
    def target(self) -> Target:
        return self._settings.target

    @property
    def timeout(self) -> float:
        return self._settings.timeout

    async def close(self) -> None:
        """Close the channel; open calls are cancelled. Idempotent."""
        if self._life.close():
            if self._follow is not None:
                await self._follow.aclose()
            await self._channel.close(grace=None)

    async def __aenter__(self) -> AsyncDaemonClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ---- inference plane ---------------------------------------------------------------

    async def submit(
        self,
        model: str,
        prompt_tokens: Sequence[int],
        *,
        max_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        top_k: int | None = None,
        seed: int | None = None,
        stop_token_ids: Sequence[int] = (),
        ignore_eos: bool = False,
        logprobs: int | None = None,
        priority: int = 0,
        client_request_id: str = "",
        resume_tokens: Sequence[int] = (),
        sampling: SamplingParams | None = None,
        deadline_s: float | None = None,
        session_id: str = "",
        call_metadata: Sequence[tuple[str, str]] = (),
    ) -> SubmitResult:
        """See `DaemonClient.submit`."""
        pb = submit_request(
            model, prompt_tokens, max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
            seed=seed, stop_token_ids=stop_token_ids, ignore_eos=ignore_eos, logprobs=logprobs, priority=priority,
            client_request_id=client_request_id, resume_tokens=resume_tokens, sampling=sampling,
            deadline_s=deadline_s, session_id=session_id,
        )  # fmt: skip
        return SubmitResult.from_pb(await self._unary("Submit", pb, extra_metadata=call_metadata))

    def wait(self, job_id: str, from_index: int = 0) -> AsyncIterator[Event]:
        """See `DaemonClient.wait` (an async iterator)."""
        return _mapped(self._stream("Wait", wait_request(job_id, from_index)), event_from_pb)

    async def cancel(self, job_id: str) -> bool:
        """See `DaemonClient.cancel`."""
        resp = await self._unary("Cancel", inference_pb2.CancelRequest(job_id=job_id))
        return not resp.already_finished

    async def generate(
        self,
        model: str,
        prompt_tokens: Sequence[int],
        *,
        max_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        top_k: int | None = None,
        seed: int | None = None,
        stop_token_ids: Sequence[int] = (),
        ignore_eos: bool = False,
        logprobs: int | None = None,
        priority: int = 0,
        client_request_id: str = "",
        resume_tokens: Sequence[int] = (),
        sampling: SamplingParams | None = None,
        deadline_s: float | None = None,
        session_id: str = "",
        call_metadata: Sequence[tuple[str, str]] = (),
    ) -> AsyncGeneration:
        """See `DaemonClient.generate`; returns an `AsyncGeneration` (`async for token in gen`,
        or `async for chunk in gen.chunks()`)."""
        pb = submit_request(
            model, prompt_tokens, max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
            seed=seed, stop_token_ids=stop_token_ids, ignore_eos=ignore_eos, logprobs=logprobs, priority=priority,
            client_request_id=client_request_id, resume_tokens=resume_tokens, sampling=sampling,
            deadline_s=deadline_s, session_id=session_id,
        )  # fmt: skip
        submitted = SubmitResult.from_pb(await self._unary("Submit", pb, extra_metadata=call_metadata))
        cursor = WaitCursor(submitted, len(pb.resume_tokens), self._settings.max_reattach)

        def open_stream(from_index: int) -> AsyncIterator[inference_pb2.WaitEvent]:
            if self._follow is not None:
                self._life.check_open()
                return self._follow.open(submitted.job_id, from_index)
            return self._open_wait(submitted.job_id, from_index)

        return AsyncGeneration(cursor, open_stream, self._wait_ready, self.cancel)

    def _open_wait(self, job_id: str, from_index: int) -> AsyncIterator[inference_pb2.WaitEvent]:
        return self._stream("Wait", wait_request(job_id, from_index))

    # ---- observation plane -------------------------------------------------------------

    async def health(self) -> observe_pb2.HealthResponse:
        return await self._unary("Health", observe_pb2.HealthRequest())

    async def status(self) -> observe_pb2.StatusResponse:
        return await self._unary("Status", observe_pb2.StatusRequest())

    async def get_model(self, alias: str) -> ModelInfo:
        """See `DaemonClient.get_model`."""
        return model_info_from_stream(await self._collect("GetModel", observe_pb2.GetModelRequest(alias=alias)))

    def watch_load(self, interval_ms: int = 0) -> AsyncIterator[LoadReport]:
        """See `DaemonClient.watch_load` (an async iterator)."""
        return _mapped(self._stream("WatchLoad", watch_load_request(interval_ms)), load_report_from_pb)

    def watch_health(self, service: str = "") -> AsyncIterator[ServingStatus]:
        """The standard `grpc.health.v1` Watch of `service` ("" = the board, or a model alias).

        Yields the status at once, then each change, until closed (`aclose()`): SERVING, or
        NOT_SERVING for NOT_SERVING, SERVICE_UNKNOWN and UNKNOWN (the daemon publishes a
        draining board as NOT_SERVING here; `watch_load` tells DRAINING apart).

        Raises (while iterating):
            Unavailable: the daemon is not reachable or the stream broke (no wait for the channel).
        """
        self._life.check_open()
        request = health_pb2.HealthCheckRequest(service=service)
        call = self._health_stub.Watch(request, metadata=self._settings.metadata)
        return _changes(_mapped(_typed(call, "Watch"), serving_status_from_health))

    # ---- operations plane --------------------------------------------------------------

    def load(
        self,
        alias: str,
        package: str,
        *,
        replace: bool = False,
        drain_timeout_ms: int | None = None,
        lanes: int | None = None,
        switch: Switch | None = None,
    ) -> AsyncIterator[operate_pb2.LoadProgress]:
        """See `DaemonClient.load` (an async iterator)."""
        req = load_request(
            alias, package, replace=replace, drain_timeout_ms=drain_timeout_ms, lanes=lanes, switch=switch
        )
        return self._stream("Load", req)

    async def load_and_wait(
        self,
        alias: str,
        package: str,
        *,
        replace: bool = False,
        drain_timeout_ms: int | None = None,
        lanes: int | None = None,
        switch: Switch | None = None,
    ) -> operate_pb2.LoadProgress:
        """See `DaemonClient.load_and_wait`."""
        last: operate_pb2.LoadProgress | None = None
        req = load_request(
            alias, package, replace=replace, drain_timeout_ms=drain_timeout_ms, lanes=lanes, switch=switch
        )
        async with contextlib.aclosing(self._stream("Load", req)) as stream:
            async for last in stream:
                if last.done:
                    break
        return load_outcome(last, alias)

    async def unload(self, alias: str, drain_timeout_ms: int | None = None) -> operate_pb2.UnloadResponse:
        timeout = operation_timeout(self.timeout, drain_timeout_ms)
        return await self._unary("Unload", unload_request(alias, drain_timeout_ms), timeout)

    async def drain(
        self, timeout_ms: int | None = None, interrupt_remaining: bool = False
    ) -> operate_pb2.DrainResponse:
        timeout = operation_timeout(self.timeout, timeout_ms)
        return await self._unary("Drain", drain_request(timeout_ms, interrupt_remaining), timeout)

    async def resume(self) -> operate_pb2.ResumeResponse:
        return await self._unary("Resume", operate_pb2.ResumeRequest())

    async def reset(self, kind: str, reason: str, model: str = "") -> operate_pb2.ResetResult:
        return await self._unary("Reset", reset_request(kind, reason, model))

    async def inject_fault(
        self,
        kind: str | None = None,
        *,
        job_index: int | None = None,
        probability: float | None = None,
        seed: int = 0,
        delay_ms: int = 0,
        clear_existing: bool = False,
    ) -> operate_pb2.InjectFaultResponse:
        req = inject_fault_request(
            kind, job_index=job_index, probability=probability, seed=seed, delay_ms=delay_ms,
            clear_existing=clear_existing,
        )  # fmt: skip
        return await self._unary("InjectFault", req)

    # ---- plumbing ----------------------------------------------------------------------

    async def _unary(
        self, method: str, request: Any, timeout: float | None = None, extra_metadata: Sequence[tuple[str, str]] = ()
    ) -> Any:
        self._life.check_open()
        rpc = getattr(self._stub, method)
        metadata = (*self._settings.metadata, *extra_metadata) if extra_metadata else self._settings.metadata
        try:
            return await rpc(request, timeout=self.timeout if timeout is None else timeout, metadata=metadata)
        except grpc.RpcError as err:
            raise error_from_rpc(err, method) from err

    async def _collect(self, method: str, request: Any) -> list[Any]:
        """Every message of a short server stream, read within the client's timeout."""
        self._life.check_open()
        call = getattr(self._stub, method)(request, timeout=self.timeout, metadata=self._settings.metadata)
        return [message async for message in _typed(call, method)]

    def _stream(self, method: str, request: Any) -> AsyncGenerator[Any, None]:
        self._life.check_open()
        call = getattr(self._stub, method)(request, metadata=self._settings.metadata)
        return _typed(call, method)

    async def _wait_ready(self) -> None:
        self._life.check_open()
        await wait_ready_async(self._channel, self.target, self.timeout, self._settings.metadata)


async def _mapped(stream: AsyncGenerator[Any, None], convert: Callable[[Any], T]) -> AsyncGenerator[T, None]:
    """`stream`'s messages converted; closing this closes (cancels) the stream."""
    async with contextlib.aclosing(stream):
        async for message in stream:
            yield convert(message)


async def _changes(statuses: AsyncGenerator[ServingStatus, None]) -> AsyncGenerator[ServingStatus, None]:
    """The first status, then only those that differ from the one before."""
    last: ServingStatus | None = None
    async with contextlib.aclosing(statuses):
        async for status in statuses:
            if status is not last:
                last = status
                yield status


async def _typed(call: Any, method: str) -> AsyncGenerator[Any, None]:
    """Iterate a server-streaming aio call, raising typed errors; closing it cancels the call."""
    try:
        async for message in call:
            yield message
    except grpc.RpcError as err:
        raise error_from_rpc(err, method) from err
    finally:
        call.cancel()
