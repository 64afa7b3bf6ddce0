"""`MetricsRegistry`: one process's OpenTelemetry `MeterProvider`, read by the OTel Prometheus
exporter into a prometheus_client `CollectorRegistry` of its own (never the global ones, so any number
can exist side by side: unit tests, a daemon and a gateway in one process).

Data flow: instruments record into the provider; `render()` (one scrape) runs the observable
instruments' callbacks, the exporter converts everything to Prometheus families, and
prometheus_client writes the text exposition format. The daemon and the gateway each own one.

Exemplars: the OTel Prometheus exporter writes the classic text format, which has none, so the SDK's
exemplar reservoirs are turned off (they would cost a span lookup per recording for nothing); trace
ids come with traces (issue 11, item 2).
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.metrics import Meter
from opentelemetry.sdk.metrics import AlwaysOffExemplarFilter, MeterProvider
from opentelemetry.sdk.resources import Resource
from prometheus_client import CollectorRegistry, generate_latest

PREFIX = "calculet_"
# `generate_latest` writes the classic text format (names escaped with underscores), which every
# Prometheus version parses as 0.0.4.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Request latencies and device phases, seconds: 100 us .. 60 s, about x1.5-x2 a step, fine at the
# millisecond end (calsim at time scale 0 answers in well under a millisecond; a real decode step
# is ~17 ms; long prompts and long answers take seconds).
LATENCY_BUCKETS_S = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075,
    0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 60.0,
)  # fmt: skip
# Ratios in [0, 1] (batch fill): eighths.
RATIO_BUCKETS = (0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875, 1.0)


def package_version() -> str:
    """The installed calculet version ("0+unknown" when run from a source tree without metadata)."""
    try:
        return version("calculet")
    except PackageNotFoundError:
        return "0+unknown"


class MetricsRegistry:
    """A MeterProvider and the Prometheus registry its exporter fills.

    Args:
        service: the OTel `service.name` (only OTel-side: the exposition has no target_info).
    """

    def __init__(self, service: str) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self._reader = PrometheusMetricReader(
            disable_target_info=True, scope_info_enabled=False, registry=self.registry
        )
        self._provider = MeterProvider(
            metric_readers=[self._reader],
            resource=Resource.create({"service.name": service, "service.version": package_version()}),
            exemplar_filter=AlwaysOffExemplarFilter(),
            shutdown_on_exit=False,  # `close` does it: many registries may come and go in one process
        )
        self.meter: Meter = self._provider.get_meter("calculet", package_version())
        self._closed = False

    def render(self) -> bytes:
        """One scrape: every instrument in the Prometheus text format (observable callbacks run now)."""
        return generate_latest(self.registry)

    def close(self) -> None:
        """Stop the provider and detach the exporter from the registry (idempotent)."""
        if not self._closed:
            self._closed = True
            self._provider.shutdown()
