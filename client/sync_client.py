"""`DaemonClient`: the blocking Python client of one board daemon (`calculet.v1.Daemon`).

Data flow: method arguments (client types, `calculet.client.types`) -> `calculet.client.messages`
(checks, protobuf requests through `calculet.client.convert`) -> the gRPC stub on the client's
channel, with the bearer-token metadata -> responses. Inference and routing results come back as
client types (`SubmitResult`, `TokenChunk` / `FinalEvent` events, `Generation`, `ModelInfo`,
`LoadReport`, `ServingStatus`); the other observation and operations answers are the protobuf
messages themselves (they are for tools such as calctl). Every failed call raises the typed
`calculet.common.errors` class of its status (`calculet.client.errors`). Nothing here imports the
daemon's engine or numpy.

Deadlines: each unary call gets `timeout` seconds, and so does GetModel's short stream, read whole;
Unload and Drain also get their drain window (or the protocol's maximum window when the daemon's
default applies); the other server streams (Wait, WatchLoad, Load, health Watch) have no deadline:
close the iterator to stop one.

Ownership: the client owns its channel until `close()`; it is safe to share between threads.
Iterators it returns own their call and cancel it when closed or garbage-collected.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Generator, Iterator, Sequence
from typing import Any, TypeVar

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from calculet.client.channel import ClientSettings, Target, TlsConfig, open_channel, wait_ready
from calculet.client.convert import (
    event_from_pb,
    load_report_from_pb,
    model_info_from_stream,
    serving_status_from_health,
)
from calculet.client.errors import error_from_rpc
from calculet.client.generation import DEFAULT_MAX_REATTACH, Generation, WaitCursor
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


class DaemonClient:
    """Blocking client of one daemon.

    Args:
        target: `unix:///abs/path.sock`, `unix:relative.sock`, a path ending in `.sock`, or
            `host:port`.
        timeout: seconds allowed for each unary call.
        token: bearer token sent as `authorization: Bearer <token>` metadata on every call (unary,
            streams, the Waits `generate` re-attaches, health checks); it must be one of the plane
            of the methods called (inference, observe or operate) when the daemon checks tokens.
        max_reattach: Wait re-attaches `generate` may make in a row without progress.
        tls: TLS to the daemon (`TlsConfig`: CA file, optional client cert/key for mutual TLS,
            optional server-name override); its files are read once, here. None = plaintext.

    Raises:
        InvalidArgument: bad target, token, timeout, max_reattach or TLS settings; a TLS file that
            cannot be read or is not PEM (the message names the path).
    """

    def __init__(
        self,
        target: str,
        *,
        timeout: float = 30.0,
        token: str | None = None,
        max_reattach: int = DEFAULT_MAX_REATTACH,
        tls: TlsConfig | None = None,
    ) -> None:
        self._settings = ClientSettings.build(target, timeout=timeout, token=token, max_reattach=max_reattach, tls=tls)
        self._life = ClientLife(f"DaemonClient({target})")
        self._channel = open_channel(self._settings.target, self._settings.tls)
        self._stub: Any = daemon_pb2_grpc.DaemonStub(self._channel)
        self._health_stub: Any = health_pb2_grpc.HealthStub(self._channel)

    @property
    def target(self) -> Target:
        return self._settings.target

    @property
    def timeout(self) -> float:
        return self._settings.timeout

    def close(self) -> None:
        """Close the channel; open calls are cancelled. Idempotent."""
        if self._life.close():
            self._channel.close()

    def __enter__(self) -> DaemonClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- inference plane ---------------------------------------------------------------

    def submit(
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
        """Enqueue a job without reading it (arguments as `generate`); read it with `wait`.

        Returns:
            The job id, the seed it samples with (the daemon's pick when none was given), the
            model generation it was admitted on, and whether it was deduplicated.

        Raises:
            InvalidArgument / NotFound / Unavailable / Overloaded / FailedPrecondition: as the
                daemon refuses (Submit in daemon.proto); InvalidArgument also for fields protobuf
                cannot carry.
        """
        pb = submit_request(
            model, prompt_tokens, max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
            seed=seed, stop_token_ids=stop_token_ids, ignore_eos=ignore_eos, logprobs=logprobs, priority=priority,
            client_request_id=client_request_id, resume_tokens=resume_tokens, sampling=sampling,
            deadline_s=deadline_s, session_id=session_id,
        )  # fmt: skip
        return SubmitResult.from_pb(self._unary("Submit", pb, extra_metadata=call_metadata))

    def wait(self, job_id: str, from_index: int = 0) -> Iterator[Event]:
        """Stream a job's events (`TokenChunk`s, then one `FinalEvent`) from `from_index`.

        No re-attach and no error raised for a failed Final (read `FinalEvent.error`); see
        `generate` for both.

        Raises (while iterating):
            NotFound: unknown job. InvalidArgument: index beyond the events produced.
            Unavailable: the stream broke.
        """
        return _mapped(self._stream("Wait", wait_request(job_id, from_index)), event_from_pb)

    def cancel(self, job_id: str) -> bool:
        """Cancel a job. Returns True if it was still running. Raises: NotFound: unknown job."""
        resp = self._unary("Cancel", inference_pb2.CancelRequest(job_id=job_id))
        return not resp.already_finished

    def generate(
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
    ) -> Generation:
        """Submit a job and return its streaming result (iterate for token ids, or `chunks()`).

        Args:
            model: model alias.
            prompt_tokens: the tokenized prompt.
            max_tokens: completion limit (resume tokens included); None = until EOS or context full.
            temperature / top_p / top_k: None = the daemon's defaults (1.0 / 1.0 / off).
            seed: None = the daemon picks one (`Generation.seed` tells which).
            stop_token_ids / ignore_eos: extra stop ids; do not stop at EOS.
            logprobs: None = none; N = the sampled token's and the N most likely.
            priority: lower is served first (vLLM convention), -1000..1000.
            client_request_id: idempotency key for retried Submits.
            resume_tokens: tokens an earlier attempt already delivered (failover).
            sampling: full sampling parameters (`calculet.client.SamplingParams`) instead of the
                individual fields; its None fields, seed included, are left to the daemon.
            deadline_s: seconds from Submit to the Final; None = none.
            session_id: affinity / prefix-reuse key.
            call_metadata: extra gRPC metadata for the Submit call: `x-request-id` (the id the
                daemon logs the job under) and W3C `traceparent`/`tracestate` (its spans' parent).

        Raises:
            InvalidArgument: bad arguments (here or at the daemon). NotFound / Unavailable /
                Overloaded / FailedPrecondition: Submit refused. Iterating raises the job's error.
        """
        pb = submit_request(
            model, prompt_tokens, max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
            seed=seed, stop_token_ids=stop_token_ids, ignore_eos=ignore_eos, logprobs=logprobs, priority=priority,
            client_request_id=client_request_id, resume_tokens=resume_tokens, sampling=sampling,
            deadline_s=deadline_s, session_id=session_id,
        )  # fmt: skip
        submitted = SubmitResult.from_pb(self._unary("Submit", pb, extra_metadata=call_metadata))
        cursor = WaitCursor(submitted, len(pb.resume_tokens), self._settings.max_reattach)

        def open_stream(from_index: int) -> Iterator[inference_pb2.WaitEvent]:
            return self._stream("Wait", wait_request(submitted.job_id, from_index))

        return Generation(cursor, open_stream, self._wait_ready, self.cancel)

    # ---- observation plane -------------------------------------------------------------

    def health(self) -> observe_pb2.HealthResponse:
        return self._unary("Health", observe_pb2.HealthRequest())

    def status(self) -> observe_pb2.StatusResponse:
        return self._unary("Status", observe_pb2.StatusRequest())

    def get_model(self, alias: str) -> ModelInfo:
        """Manifest summary, state, tokenizer.json and chat template of an alias (the daemon streams
        tokenizer.json in pieces; they are joined here, all within one `timeout`).

        Raises: NotFound: unknown alias.
        """
        return model_info_from_stream(self._collect("GetModel", observe_pb2.GetModelRequest(alias=alias)))

    def watch_load(self, interval_ms: int = 0) -> Iterator[LoadReport]:
        """Load reports, one at once and then every interval (0 = daemon default) until closed.

        Raises (while iterating):
            InvalidArgument: interval out of range (0 or 50..60000). Unavailable: the stream broke.
        """
        return _mapped(self._stream("WatchLoad", watch_load_request(interval_ms)), load_report_from_pb)

    def watch_health(self, service: str = "") -> Iterator[ServingStatus]:
        """The standard `grpc.health.v1` Watch of `service` ("" = the board, or a model alias).

        Yields the status at once, then each change, until closed: SERVING, or NOT_SERVING for
        NOT_SERVING, SERVICE_UNKNOWN and UNKNOWN (the daemon publishes a draining board as
        NOT_SERVING here; `watch_load` tells DRAINING apart).

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
    ) -> Iterator[operate_pb2.LoadProgress]:
        """Stream a load's progress until the message with done = true (FAILED ones included).
        With `switch`, the load replaces exactly that generation (ABORTED if the board serves
        another) and the stream reports its drain and unload too.

        Raises (while iterating):
            InvalidArgument (alias, path), NotFound (package), FailedPrecondition (alias loaded,
            concurrent load), Unavailable (device unhealthy): the load was refused.
        """
        req = load_request(
            alias, package, replace=replace, drain_timeout_ms=drain_timeout_ms, lanes=lanes, switch=switch
        )
        return self._stream("Load", req)

    def load_and_wait(
        self,
        alias: str,
        package: str,
        *,
        replace: bool = False,
        drain_timeout_ms: int | None = None,
        lanes: int | None = None,
        switch: Switch | None = None,
    ) -> operate_pb2.LoadProgress:
        """Load and return the final (READY) progress.

        Raises:
            The refusals of `load`, or the typed error of a FAILED load (e.g. FailedPrecondition
            for an invalid package).
        """
        last: operate_pb2.LoadProgress | None = None
        req = load_request(
            alias, package, replace=replace, drain_timeout_ms=drain_timeout_ms, lanes=lanes, switch=switch
        )
        stream = self._stream("Load", req)
        with contextlib.closing(stream):
            for last in stream:
                if last.done:
                    break
        return load_outcome(last, alias)

    def unload(self, alias: str, drain_timeout_ms: int | None = None) -> operate_pb2.UnloadResponse:
        """Drain and unload an alias; returns when it is UNLOADED.

        Raises: NotFound (alias), FailedPrecondition (loading/unloading), InvalidArgument (timeout).
        """
        timeout = operation_timeout(self.timeout, drain_timeout_ms)
        return self._unary("Unload", unload_request(alias, drain_timeout_ms), timeout)

    def drain(self, timeout_ms: int | None = None, interrupt_remaining: bool = False) -> operate_pb2.DrainResponse:
        """Stop admitting on the board and wait for running jobs. Raises: InvalidArgument (timeout)."""
        timeout = operation_timeout(self.timeout, timeout_ms)
        return self._unary("Drain", drain_request(timeout_ms, interrupt_remaining), timeout)

    def resume(self) -> operate_pb2.ResumeResponse:
        """Admit again after Drain (idempotent)."""
        return self._unary("Resume", operate_pb2.ResumeRequest())

    def reset(self, kind: str, reason: str, model: str = "") -> operate_pb2.ResetResult:
        """Operator reset; `kind` is "ccu", "configuration" or "device". Returns the audit record.

        Raises: InvalidArgument (kind, reason, model), NotFound (model), FailedPrecondition
        (reset in progress).
        """
        return self._unary("Reset", reset_request(kind, reason, model))

    def inject_fault(
        self,
        kind: str | None = None,
        *,
        job_index: int | None = None,
        probability: float | None = None,
        seed: int = 0,
        delay_ms: int = 0,
        clear_existing: bool = False,
    ) -> operate_pb2.InjectFaultResponse:
        """Plan a calsim fault (kind e.g. "ccu_exception"; exactly one trigger).

        Raises: FailedPrecondition (fault injection disabled), InvalidArgument (bad spec).
        """
        req = inject_fault_request(
            kind, job_index=job_index, probability=probability, seed=seed, delay_ms=delay_ms,
            clear_existing=clear_existing,
        )  # fmt: skip
        return self._unary("InjectFault", req)

    # ---- plumbing ----------------------------------------------------------------------

    def _unary(
        self, method: str, request: Any, timeout: float | None = None, extra_metadata: Sequence[tuple[str, str]] = ()
    ) -> Any:
        self._life.check_open()
        rpc = getattr(self._stub, method)
        metadata = (*self._settings.metadata, *extra_metadata) if extra_metadata else self._settings.metadata
        try:
            return rpc(request, timeout=self.timeout if timeout is None else timeout, metadata=metadata)
        except grpc.RpcError as err:
            raise error_from_rpc(err, method) from err

    def _collect(self, method: str, request: Any) -> list[Any]:
        """Every message of a short server stream, read within the client's timeout."""
        self._life.check_open()
        call = getattr(self._stub, method)(request, timeout=self.timeout, metadata=self._settings.metadata)
        return list(_typed(call, method))

    def _stream(self, method: str, request: Any) -> Generator[Any, None, None]:
        self._life.check_open()
        call = getattr(self._stub, method)(request, metadata=self._settings.metadata)
        return _typed(call, method)

    def _wait_ready(self) -> None:
        self._life.check_open()
        wait_ready(self._channel, self.target, self.timeout, self._settings.metadata)


def _mapped(stream: Generator[Any, None, None], convert: Callable[[Any], T]) -> Generator[T, None, None]:
    """`stream`'s messages converted; closing this closes (cancels) the stream."""
    with contextlib.closing(stream):
        for message in stream:
            yield convert(message)


def _changes(statuses: Generator[ServingStatus, None, None]) -> Generator[ServingStatus, None, None]:
    """The first status, then only those that differ from the one before."""
    last: ServingStatus | None = None
    with contextlib.closing(statuses):
        for status in statuses:
            if status is not last:
                last = status
                yield status


def _typed(call: Any, method: str) -> Generator[Any, None, None]:
    """Iterate a server-streaming call, raising typed errors; closing it cancels the call."""
    try:
        yield from call
    except grpc.RpcError as err:
        raise error_from_rpc(err, method) from err
    finally:
        call.cancel()
