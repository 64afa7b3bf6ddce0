"""Telemetry both the daemon and the gateway use: log lines, traces and the metrics registry base.

Each process builds its own from these (the daemon's metrics in `calculet.daemon.telemetry`, the
gateway's in `calculet.gateway.telemetry`); nothing here knows either side's domain.

    tracing_env.py      whether OTEL_TRACES_EXPORTER asks for traces, without importing OpenTelemetry
    tracing.py          a TracerProvider when OTEL_* asks for one; W3C trace context in gRPC metadata
    logs.py             setup_logging: text or JSON log lines, with the request, job and model ids
    registry.py         MetricsRegistry: a MeterProvider and its own Prometheus registry, buckets
"""
