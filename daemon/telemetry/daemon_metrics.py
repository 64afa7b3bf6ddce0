"""`DaemonMetrics`: the daemon's Prometheus metrics (docs/metrics.md), served on `--metrics-listen`.

Data flow: `EngineMetrics` is added to the engine as an observer and records counters and histograms
from its events as they happen; `StatusGauges` read one `StatusView` per scrape. `render` is a scrape:
it takes the view (`DeviceCore.status`, the Status RPC's snapshot: never under the engine lock), runs
the OTel collection (which calls the gauges' callbacks) and writes the Prometheus text. Scrapes are
serialised, so each sees its own view. `start_metrics` wires it to a `MetricsServer`.

Everything lives in one `MetricsRegistry` owned here: no global OpenTelemetry or prometheus_client
state, so tests may create any number.
"""

from __future__ import annotations

import logging
import threading

from calculet.common.telemetry.registry import CONTENT_TYPE, MetricsRegistry
from calculet.daemon.core.device_core import DeviceCore
from calculet.daemon.core.observe.status import StatusView
from calculet.daemon.telemetry.engine_metrics import EngineMetrics
from calculet.daemon.telemetry.http import MetricsServer
from calculet.daemon.telemetry.status_gauges import StatusGauges

log = logging.getLogger(__name__)


class DaemonMetrics:
    """The metrics of one board's daemon.

    Args:
        core: the board (its engine gets the observer now: add it before `start` to count warm-ups).
    """

    def __init__(self, core: DeviceCore) -> None:
        self._core = core
        self._registry = MetricsRegistry("calculet-daemon")
        self._lock = threading.Lock()  # one scrape at a time; guards `_view`
        self._view: StatusView | None = None
        self._gauges = StatusGauges(self._registry.meter, lambda: self._view)
        core.engine.add_observer(EngineMetrics(self._registry.meter))

    def render(self) -> tuple[bytes, str]:
        """One scrape: (Prometheus text, its content type)."""
        with self._lock:
            self._view = self._core.status()
            try:
                return self._registry.render(), CONTENT_TYPE
            finally:
                self._view = None

    def close(self) -> None:
        self._registry.close()


class MetricsEndpoint:
    """`DaemonMetrics` served over HTTP at `listen` (HOST:PORT) until `close`.

    Raises (on construction):
        InvalidArgument: the address is malformed or cannot be bound.
    """

    def __init__(self, core: DeviceCore, listen: str) -> None:
        self.metrics = DaemonMetrics(core)
        try:
            self.server = MetricsServer(listen, self.metrics.render)
        except BaseException:
            self.metrics.close()
            raise
        log.info("metrics on %s", self.server.url)

    def close(self) -> None:
        self.server.close()
        self.metrics.close()
