"""The daemon's spans, built from engine events by `JobTraces`, into an in-memory exporter."""

from __future__ import annotations

import time

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from calculet.common.errors import ErrorKind
from calculet.common.telemetry.tracing import remote_context, trace_headers
from calculet.daemon.core.events import FinishReason, Timings, Usage
from calculet.daemon.core.observe.observer import (
    DeviceJobDone,
    DeviceJobStarted,
    RequestFinished,
    RequestQueued,
    RowDone,
)
from calculet.daemon.core.request import NO_TRACE, RequestTrace
from calculet.daemon.device.types import EngineSlot, JobStatus, JobTimestamps, TaskType
from calculet.daemon.telemetry.job_traces import MAX_JOB_SPANS, JobTraces

TRACE_ID = 0x0AF7651916CD43DD8448EB211C80319C
PARENT_SPAN = 0xB7AD6B7169203331
TRACEPARENT = f"00-{TRACE_ID:032x}-{PARENT_SPAN:016x}-01"


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def traces(exporter: InMemorySpanExporter) -> JobTraces:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return JobTraces(provider)


def queued(job_id: str, t: float, trace: RequestTrace = NO_TRACE, internal: bool = False) -> RequestQueued:
    return RequestQueued(job_id, "tiny", 1, 5, 0, "", internal, t, trace=trace)


def job(device_job_id: int, task: TaskType, job_ids: tuple[str, ...], t: float, **kw: object) -> DeviceJobDone:
    stamps = JobTimestamps(0.0, 0.0, 0.001, 0.001, 0.004, 0.004, 0.0045)
    rows = tuple(RowDone(j, True, task is TaskType.PREFILL, False) for j in job_ids)
    fields: dict[str, object] = dict(
        device_job_id=device_job_id, task=task, bank=EngineSlot.PING, model="tiny", generation=1,
        status=JobStatus.DONE, rows=rows, batch=4, stamps=stamps, sampling_s=0.0002, postprocess_s=0.0001,
        t_submit=t, t_done=t + 0.005,
    )  # fmt: skip
    fields.update(kw)
    return DeviceJobDone(**fields)  # type: ignore[arg-type]


def finished(job_id: str, t: float, reason: FinishReason = FinishReason.LENGTH, **kw: object) -> RequestFinished:
    fields: dict[str, object] = dict(
        job_id=job_id, model="tiny", generation=1, reason=reason, error_kind=None, usage=Usage(5, 2),
        timings=Timings(), internal=False, t=t,
    )  # fmt: skip
    fields.update(kw)
    return RequestFinished(**fields)  # type: ignore[arg-type]


def by_name(spans: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]


def test_a_request_becomes_a_job_span_under_the_callers_span_with_queue_job_and_sampling_children(
    traces: JobTraces, exporter: InMemorySpanExporter
) -> None:
    t0 = time.monotonic()
    traces.request_queued(queued("j-1", t0, RequestTrace("req-7", TRACEPARENT)))
    traces.device_job_started(DeviceJobStarted(1, TaskType.PREFILL, EngineSlot.PING, "tiny", 1, ("j-1",), t0 + 0.010))
    traces.device_job_done(job(1, TaskType.PREFILL, ("j-1",), t0 + 0.010))
    traces.device_job_done(job(2, TaskType.DECODE, ("j-1", "other"), t0 + 0.020))
    assert exporter.get_finished_spans() == (), "nothing is exported before the request ends"
    traces.request_finished(finished("j-1", t0 + 0.030))

    spans = exporter.get_finished_spans()
    (root,) = by_name(spans, "calculet.job")
    assert root.kind is SpanKind.SERVER
    assert root.context.trace_id == TRACE_ID and root.parent is not None and root.parent.span_id == PARENT_SPAN
    assert root.attributes is not None and root.attributes["calculet.request_id"] == "req-7"
    assert root.end_time is not None and root.start_time is not None
    assert root.end_time - root.start_time == pytest.approx(30e6, abs=1e3)  # 30 ms from the events' own times
    (queue,) = by_name(spans, "queue")
    assert queue.end_time is not None and queue.start_time is not None
    assert queue.end_time - queue.start_time == pytest.approx(10e6, abs=1e3)  # until admission
    (prefill,), (decode,) = by_name(spans, "prefill"), by_name(spans, "decode")
    samplings = by_name(spans, "sampling")
    assert {s.parent.span_id for s in (queue, prefill, decode) if s.parent} == {root.context.span_id}
    assert sorted(s.parent.span_id for s in samplings if s.parent) == sorted(
        [prefill.context.span_id, decode.context.span_id]
    )
    assert decode.attributes is not None and decode.attributes["calculet.device.compute_s"] == pytest.approx(0.003)
    assert all(s.context.trace_id == TRACE_ID for s in spans)


def test_without_trace_context_the_job_starts_a_trace_and_errors_are_marked(
    traces: JobTraces, exporter: InMemorySpanExporter
) -> None:
    t0 = time.monotonic()
    traces.request_queued(queued("j-2", t0))
    traces.device_job_done(job(3, TaskType.PREFILL, ("j-2",), t0, status=JobStatus.CCU_EXCEPTION))
    traces.request_finished(finished("j-2", t0 + 0.01, FinishReason.ERROR, error_kind=ErrorKind.ABORTED))
    spans = exporter.get_finished_spans()
    (root,) = by_name(spans, "calculet.job")
    assert root.parent is None and root.status.status_code is StatusCode.ERROR
    (prefill,) = by_name(spans, "prefill")
    assert prefill.status.status_code is StatusCode.ERROR
    (queue,) = by_name(spans, "queue")  # never admitted: the queue lasted until the end
    assert queue.end_time == root.end_time


def test_probes_get_no_spans_and_long_generations_are_capped(traces: JobTraces, exporter: InMemorySpanExporter) -> None:
    t0 = time.monotonic()
    traces.request_queued(queued("probe", t0, internal=True))
    traces.device_job_done(job(1, TaskType.PREFILL, ("probe",), t0))
    traces.request_finished(finished("probe", t0 + 0.01, internal=True))
    assert exporter.get_finished_spans() == ()

    traces.request_queued(queued("long", t0))
    for i in range(MAX_JOB_SPANS + 10):
        traces.device_job_done(job(10 + i, TaskType.DECODE, ("long",), t0 + i * 0.001))
    traces.request_finished(finished("long", t0 + 1.0))
    spans = exporter.get_finished_spans()
    assert len(by_name(spans, "decode")) == MAX_JOB_SPANS
    (root,) = by_name(spans, "calculet.job")
    assert root.attributes is not None and root.attributes["calculet.jobs_not_traced"] == 10


def test_trace_headers_round_trip_to_the_remote_parent() -> None:
    provider = TracerProvider()
    span = provider.get_tracer("t").start_span("caller")
    headers = dict(trace_headers(span))
    context = remote_context(headers["traceparent"])
    assert context is not None
    child = provider.get_tracer("t").start_span("callee", context=context)
    assert child.get_span_context().trace_id == span.get_span_context().trace_id
    assert remote_context("") is None
    orphan = provider.get_tracer("t").start_span("x", context=remote_context("00-garbage"))
    assert orphan.get_span_context().trace_id != span.get_span_context().trace_id


def test_a_caller_that_does_not_sample_gets_no_spans_and_no_timeline(
    traces: JobTraces, exporter: InMemorySpanExporter
) -> None:
    t0 = time.monotonic()
    unsampled = f"00-{TRACE_ID:032x}-{PARENT_SPAN:016x}-00"
    traces.request_queued(queued("j-3", t0, RequestTrace("req-9", unsampled)))
    traces.device_job_done(job(4, TaskType.PREFILL, ("j-3",), t0))
    traces.request_finished(finished("j-3", t0 + 0.01))
    assert exporter.get_finished_spans() == ()
    assert traces._live == {}  # nothing kept for it at any point after the Submit
