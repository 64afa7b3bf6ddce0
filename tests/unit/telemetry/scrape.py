"""Reading a Prometheus text exposition in tests: `Scrape(text)` parsed with prometheus_client's own
parser, and lookups by sample name and labels (unit and integration tests share it)."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


class Scrape:
    """One scrape's samples: (sample name, labels) -> value, and the metric families' types."""

    def __init__(self, text: str) -> None:
        self.samples: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
        self.types: dict[str, str] = {}
        for family in text_string_to_metric_families(text):
            self.types[family.name] = family.type
            for s in family.samples:
                self.samples[(s.name, frozenset(s.labels.items()))] = s.value

    def value(self, name: str, **labels: str) -> float:
        """The sum of every sample named `name` whose labels include `labels` (0 if none)."""
        want = set(labels.items())
        return sum(v for (n, ls), v in self.samples.items() if n == name and want <= ls)

    def one(self, name: str, **labels: str) -> float:
        """The one sample named `name` with exactly these labels.

        Raises:
            KeyError: there is none.
        """
        return self.samples[(name, frozenset(labels.items()))]

    def labels(self, name: str) -> list[dict[str, str]]:
        """The label sets of every sample named `name`."""
        return [dict(ls) for (n, ls) in self.samples if n == name]


def delta(after: Scrape, before: Scrape, name: str, **labels: str) -> float:
    return after.value(name, **labels) - before.value(name, **labels)
