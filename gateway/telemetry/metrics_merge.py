"""Merge the Prometheus text of several gateway workers into one exposition, each sample labelled
with its worker (`worker="I"`).

Each worker's text is parsed (prometheus_client's text parser), its families are merged by name in
the order first seen (one HELP and TYPE each, the first worker's), every sample gets the `worker`
label (replacing one it had), and the result is written back by prometheus_client, which escapes
label values as the format requires. A worker whose text is missing or does not parse contributes
nothing but `calculet_gateway_worker_up{worker="I"} 0`; the others get 1. A family whose type differs
from the first worker's (never, from workers of one build) is left out for that worker.

Labelled, not summed: a restarted worker's counters start again from 0 as a series of their own,
which Prometheus's rate() reads as a counter reset; a sum over workers would go backwards instead,
and gauges of each worker's view of the boards (`calculet_gateway_board_jobs`) are not additive.
Pure: text in, bytes out.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

log = logging.getLogger("calculet.gateway.metrics")

WORKER_LABEL = "worker"
WORKER_UP = "calculet_gateway_worker_up"
WORKER_UP_HELP = "1 when this scrape holds the worker's metrics, 0 when the worker did not answer"

Scrape = tuple[str, str | None]  # (worker label value, its exposition text or None if it did not answer)


def merge_expositions(scrapes: Sequence[Scrape]) -> bytes:
    """One exposition of every worker's metrics, labelled by worker (module docstring).

    Args:
        scrapes: (worker, text or None) per worker, in worker order.
    Returns:
        The Prometheus text format (0.0.4), UTF-8.
    """
    families: dict[str, Metric] = {}
    up = Metric(WORKER_UP, WORKER_UP_HELP, "gauge")
    for worker, text in scrapes:
        parsed = _parse(worker, text)
        up.add_sample(WORKER_UP, {WORKER_LABEL: worker}, 0.0 if parsed is None else 1.0)
        for family in parsed or ():
            into = families.setdefault(family.name, Metric(family.name, family.documentation, family.type))
            if into.type != family.type:
                log.warning("metrics of worker %s: %s is a %s, not a %s: left out", worker, family.name,
                            family.type, into.type)  # fmt: skip
                continue
            into.samples += [s._replace(labels={**s.labels, WORKER_LABEL: worker}) for s in family.samples]
    families[WORKER_UP] = up
    return render(families.values())


def render(families: Iterable[Metric]) -> bytes:
    """The Prometheus text of `families`, as prometheus_client writes a registry's."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Fixed(list(families)))
    return generate_latest(registry)


def _parse(worker: str, text: str | None) -> list[Metric] | None:
    if text is None:
        return None
    try:
        return list(text_string_to_metric_families(text))
    except (ValueError, TypeError, IndexError) as err:
        log.warning("metrics of worker %s do not parse: %s", worker, err)
        return None


class _Fixed:
    """A collector of fixed families (prometheus_client's Collector protocol)."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterable[Metric]:
        return self._families
