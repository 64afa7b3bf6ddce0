"""Telemetry of the gateway: its Prometheus metrics at `GET /metrics` (docs/metrics.md).

The only package of the gateway that imports OpenTelemetry. `metrics.py` owns the instruments (in a
`MetricsRegistry` of its own, shared code with the daemon's), `middleware.py` counts every HTTP request.
"""
