"""The order in which pytest-xdist's `worksteal` scheduler hands the tests out.

`worksteal` splits the collected list, in order, into one contiguous chunk per worker (by count,
not by time); each worker runs its chunk front to back, and an idle worker steals the back half of
the longest queue. Left in file order, the first chunk holds every integration test (tests/integration
sorts first) and the two-minute soak starts last, so the run ends on one worker's tail.

`reorder` lays the list out as those chunks, balanced by expected time (tests/durations.txt; a test
not listed weighs DEFAULT_S): the longest first into the least loaded chunk, each chunk longest
first, so the long integration tests start at once on every worker and what is left to steal at the
end is short. Tests that share a module- or class-scoped fixture stay together and in file order
(apart, each worker would start that fixture again). The order changes no test: each still gets its
own fixtures as before.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

DURATIONS = Path(__file__).with_name("durations.txt")
# Seconds for a test not in DURATIONS: an integration test starts at least one process.
DEFAULT_S = {True: 5.0, False: 0.05}
SHARED_SCOPES = frozenset({"module", "class", "package"})


@dataclass
class Group:
    """Tests that must run together, in file order, on one worker."""

    items: list[pytest.Item]
    seconds: float


@dataclass
class Chunk:
    """What one worker is handed first: `size` tests."""

    size: int
    groups: list[Group] = field(default_factory=list)
    count: int = 0
    seconds: float = 0.0

    def add(self, group: Group) -> None:
        self.groups.append(group)
        self.count += len(group.items)
        self.seconds += group.seconds


def read_durations(path: Path = DURATIONS) -> dict[str, float]:
    """`seconds nodeid` lines; '#' starts a comment line."""
    table: dict[str, float] = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            seconds, nodeid = line.split(" ", 1)
            table[nodeid] = float(seconds)
    return table


def chunk_sizes(total: int, workers: int) -> list[int]:
    """How many tests `worksteal` sends each of `workers` idle workers at the start (its own arithmetic)."""
    sizes = []
    for i in range(workers):
        sizes.append(total // (workers - i))
        total -= sizes[-1]
    return sizes


def _group_key(item: pytest.Item) -> str:
    info = getattr(item, "_fixtureinfo", None)
    defs = info.name2fixturedefs.values() if info is not None else ()
    shared = any(d.scope in SHARED_SCOPES for chain in defs for d in chain)
    return item.nodeid.split("::")[0] if shared else item.nodeid


def groups_of(items: Sequence[pytest.Item], durations: dict[str, float]) -> list[Group]:
    groups: dict[str, Group] = {}
    for item in items:
        seconds = durations.get(item.nodeid, DEFAULT_S[item.get_closest_marker("integration") is not None])
        group = groups.setdefault(_group_key(item), Group([], 0.0))
        group.items.append(item)
        group.seconds += seconds
    return list(groups.values())


def reorder(items: list[pytest.Item], workers: int, durations: dict[str, float]) -> None:
    """Reorder `items` in place into `workers` balanced chunks (see the module docstring)."""
    chunks = [Chunk(size) for size in chunk_sizes(len(items), workers)]
    for group in sorted(groups_of(items, durations), key=lambda g: -g.seconds):
        fitting = [c for c in chunks if c.count + len(group.items) <= c.size]
        # A group too big for any chunk's room spills its tail into the next chunk: still correct.
        target = min(fitting, key=lambda c: c.seconds) if fitting else max(chunks, key=lambda c: c.size - c.count)
        target.add(group)
    items[:] = [item for chunk in chunks for group in chunk.groups for item in group.items]


def xdist_workers() -> int:
    """The number of xdist workers when this process is one of them, else 0."""
    return int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
