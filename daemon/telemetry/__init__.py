"""Telemetry of the daemon: Prometheus metrics through the OpenTelemetry SDK (docs/metrics.md).

The only package of the daemon that imports OpenTelemetry or prometheus_client. It reads the domain
through `EngineObserver` events (`core/observe/observer.py`) and the Status view; the domain never imports it.
Its instruments live in a `MetricsRegistry` (`calculet.common.telemetry.registry`, shared with the gateway).

    engine_metrics.py   EngineMetrics: engine events -> counters and histograms
    status_gauges.py    StatusGauges: observable gauges read from one Status view per scrape
    daemon_metrics.py   DaemonMetrics / MetricsEndpoint: both together, served by http.py
    http.py             MetricsServer: GET /metrics on --metrics-listen HOST:PORT
"""
