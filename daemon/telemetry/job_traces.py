"""`JobTraces`: the daemon's spans, built from engine events once a request ends.

One span per request (`calculet.job`, kind SERVER), child of the caller's span when the Submit
carried W3C trace context (the gateway's attempt span), else the root of a trace of its own. Its
children, from the times the events recorded (never host clocks read here):

    queue                 Submit accepted -> its first device job accepted (admission)
    prefill / decode      each device job that carried it: accepted -> its wait returned, with the
                          device's own phase times (h2d, compute, d2h) as attributes
      sampling            that job's host sampling, right after the wait returned

A long generation has a decode job per token: only the first `MAX_JOB_SPANS` jobs get spans, the
rest are counted on the request span (`calculet.jobs_not_traced`). Warm-up probes get none.

Data flow: an `EngineObserver` on the hub's thread (one thread: no locks) starts the request span at
`RequestQueued` (with the Submit's own time), so the sampler (`OTEL_TRACES_SAMPLER`, parent-based by
default: the gateway's sampled flag decides) decides at once and an unsampled request costs no
timeline; for a sampled one it keeps a small timeline until `RequestFinished`, then builds and ends
the children and the request span with explicit times; the provider's batch processor exports
them. Only added when tracing is on.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from opentelemetry.context import Context
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer, set_span_in_context
from opentelemetry.util.types import AttributeValue

from calculet.common.telemetry.tracing import remote_context, wall_ns, wall_offset_ns
from calculet.daemon.core.observe.observer import (
    DeviceJobDone,
    DeviceJobStarted,
    EngineObserver,
    RequestFinished,
    RequestQueued,
)
from calculet.daemon.device.types import JobStatus

MAX_JOB_SPANS = 128


@dataclass
class _Timeline:
    queued: RequestQueued
    root: Span  # started at the Submit's time, so the sampler decides before anything is recorded
    offset_ns: int  # wall - monotonic when it started: every time of the request converts alike
    admitted_t: float | None = None
    jobs: list[DeviceJobDone] = field(default_factory=list)
    not_traced: int = 0


class JobTraces(EngineObserver):
    """Engine events -> spans (see the module docstring).

    Args:
        provider: where the spans go (built from `OTEL_*` by `tracing.tracer_provider_from_env`, or
            a test's provider with an in-memory exporter).
    """

    def __init__(self, provider: TracerProvider) -> None:
        self._tracer: Tracer = provider.get_tracer("calculet.daemon")
        self._live: dict[str, _Timeline] = {}

    def request_queued(self, event: RequestQueued) -> None:
        if event.internal:
            return
        offset = wall_offset_ns()
        root = self._tracer.start_span(
            "calculet.job",
            context=remote_context(event.trace.traceparent, event.trace.tracestate),
            kind=SpanKind.SERVER,
            start_time=wall_ns(event.t, offset),
        )
        if root.is_recording():  # not sampled (OTEL_TRACES_SAMPLER, the caller's flag): keep nothing
            self._live[event.job_id] = _Timeline(event, root, offset)

    def device_job_started(self, event: DeviceJobStarted) -> None:
        for job_id in event.job_ids:
            timeline = self._live.get(job_id)
            if timeline is not None and timeline.admitted_t is None:
                timeline.admitted_t = event.t

    def device_job_done(self, event: DeviceJobDone) -> None:
        for row in event.rows:
            timeline = self._live.get(row.job_id)
            if timeline is None:
                continue
            if len(timeline.jobs) < MAX_JOB_SPANS:
                timeline.jobs.append(event)
            else:
                timeline.not_traced += 1

    def request_finished(self, event: RequestFinished) -> None:
        timeline = self._live.pop(event.job_id, None)
        if timeline is not None:
            self._emit(timeline, event)

    def _emit(self, timeline: _Timeline, end: RequestFinished) -> None:
        q, root, offset = timeline.queued, timeline.root, timeline.offset_ns
        root.set_attributes(
            {
                "calculet.job_id": q.job_id,
                "calculet.request_id": q.trace.request_id,
                "calculet.model": q.model,
                "calculet.generation": q.generation,
                "calculet.prompt_tokens": q.prompt_tokens,
                "calculet.resumed_tokens": q.resumed_tokens,
                "calculet.completion_tokens": end.usage.completion_tokens,
                "calculet.finish_reason": end.reason.value,
                "calculet.jobs_not_traced": timeline.not_traced,
            }
        )
        if end.error_kind is not None:
            root.set_status(Status(StatusCode.ERROR, end.error_kind.value))
        parent = set_span_in_context(root)
        queue_end = timeline.admitted_t if timeline.admitted_t is not None else end.t
        self._tracer.start_span("queue", context=parent, start_time=wall_ns(q.t, offset)).end(
            end_time=wall_ns(queue_end, offset)
        )
        for job in timeline.jobs:
            self._job_span(job, parent, offset)
        root.end(end_time=wall_ns(end.t, offset))

    def _job_span(self, job: DeviceJobDone, parent: Context, offset: int) -> None:
        attributes: dict[str, AttributeValue] = {
            "calculet.device_job_id": job.device_job_id,
            "calculet.bank": job.bank.value,
            "calculet.rows": len(job.rows),
            "calculet.batch": job.batch,
            "calculet.status": job.status.value,
        }
        if job.stamps is not None:
            attributes.update(
                {"calculet.device.h2d_s": job.stamps.h2d, "calculet.device.compute_s": job.stamps.compute}
            )
            attributes["calculet.device.d2h_s"] = job.stamps.d2h
        span: Span = self._tracer.start_span(
            job.task.value, context=parent, start_time=wall_ns(job.t_submit, offset), attributes=attributes
        )
        if job.status is not JobStatus.DONE:
            span.set_status(Status(StatusCode.ERROR, job.status.value))
        if job.sampling_s > 0:
            inner = set_span_in_context(span)
            sampling = self._tracer.start_span("sampling", context=inner, start_time=wall_ns(job.t_done, offset))
            sampling.end(end_time=wall_ns(job.t_done + job.sampling_s, offset))
        span.end(end_time=wall_ns(job.t_done, offset))
