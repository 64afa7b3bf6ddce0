"""Traces for the daemon and the gateway: a TracerProvider only when the standard `OTEL_*`
variables ask for one, and W3C trace context carried in gRPC metadata (docs/metrics.md).

`tracer_provider_from_env(service)` reads `OTEL_TRACES_EXPORTER` (a comma list; unset, empty or
"none" = no tracing: it returns None and callers build no span at all, so tracing off costs
nothing). Each name is looked up among the `opentelemetry_traces_exporter` entry points, as the
OpenTelemetry SDK's own auto-configuration does: "console" ships with the SDK, "otlp" comes with
`opentelemetry-exporter-otlp` when installed. Spans are exported by a `BatchSpanProcessor`
(`OTEL_BSP_*` tune it); the resource comes from `OTEL_SERVICE_NAME` / `OTEL_RESOURCE_ATTRIBUTES`
over the given default service name. Tests pass their own provider (an in-memory exporter).

Propagation: `trace_headers(span)` gives the `traceparent` (and `tracestate`) entries a caller puts
in a call's metadata; `remote_context(traceparent, tracestate)` turns them back into the parent
context on the other side. `wall_ns(monotonic_s, wall_offset_ns())` converts the engine's monotonic times to the
epoch nanoseconds spans carry, so spans can be built after the fact from recorded times.
"""

from __future__ import annotations

import os
import time
from importlib.metadata import entry_points
from typing import TYPE_CHECKING

from opentelemetry.context import Context
from opentelemetry.trace import Span, set_span_in_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from calculet.common.errors import InvalidArgument
from calculet.common.telemetry.tracing_env import ENV_EXPORTER, exporter_names

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter

EXPORTER_GROUP = "opentelemetry_traces_exporter"
TRACEPARENT, TRACESTATE = "traceparent", "tracestate"
_PROPAGATOR = TraceContextTextMapPropagator()


def tracer_provider_from_env(service: str) -> TracerProvider | None:
    """A provider exporting where `OTEL_TRACES_EXPORTER` says, or None when tracing is off.

    Args:
        service: default `service.name` ("calculet-daemon", "calculet-gateway").

    Raises:
        InvalidArgument: an exporter name no installed package provides.
    """
    names = exporter_names(os.environ.get(ENV_EXPORTER))
    if not names:
        return None
    # The SDK's tracing only here: every gateway imports this module (propagation), few trace.
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    exporters = [_exporter(name) for name in names]
    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: service}))
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


def _exporter(name: str) -> SpanExporter:
    found = entry_points(group=EXPORTER_GROUP, name=name)
    if not found:
        known = ", ".join(sorted(e.name for e in entry_points(group=EXPORTER_GROUP))) or "none installed"
        raise InvalidArgument(f"{ENV_EXPORTER}: no trace exporter {name!r} (installed: {known})")
    exporter: SpanExporter = next(iter(found)).load()()
    return exporter


def trace_headers(span: Span) -> list[tuple[str, str]]:
    """The W3C trace-context entries that make `span` the remote parent of the callee's spans."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=set_span_in_context(span))
    return sorted(carrier.items())


def remote_context(traceparent: str, tracestate: str = "") -> Context | None:
    """The parent context a caller sent (None when it sent none or an invalid one: a new trace)."""
    if not traceparent:
        return None
    carrier = {TRACEPARENT: traceparent, **({TRACESTATE: tracestate} if tracestate else {})}
    context = _PROPAGATOR.extract(carrier)
    return context if context else None


def wall_offset_ns() -> int:
    """Epoch nanoseconds minus monotonic nanoseconds now: read once for a group of spans, so their
    durations are exactly the monotonic ones (two reads of the clocks may be a preemption apart)."""
    return time.time_ns() - time.monotonic_ns()


def wall_ns(monotonic_s: float, offset_ns: int) -> int:
    """Epoch nanoseconds of a `time.monotonic()` reading (spans carry wall-clock times)."""
    return round(monotonic_s * 1e9) + offset_ns
