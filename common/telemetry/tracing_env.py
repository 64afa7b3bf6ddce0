"""Whether the standard `OTEL_TRACES_EXPORTER` variable asks for traces: read without importing
OpenTelemetry, so a process with tracing off never loads it (`tracing.py` builds the provider)."""

from __future__ import annotations

import os

ENV_EXPORTER = "OTEL_TRACES_EXPORTER"


def exporter_names(value: str | None) -> list[str]:
    """The exporters `OTEL_TRACES_EXPORTER` names ([] for unset, empty or "none")."""
    names = [n.strip() for n in (value or "").split(",") if n.strip()]
    return [] if names in ([], ["none"]) else names


def tracing_requested() -> bool:
    """`OTEL_TRACES_EXPORTER` names at least one exporter."""
    return bool(exporter_names(os.environ.get(ENV_EXPORTER)))
