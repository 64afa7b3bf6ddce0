"""tests/xdist_order.py: the chunks it lays out match worksteal's split, are balanced by time,
start with their longest test, and keep the tests of a shared fixture together in file order."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, cast

import pytest

from tests.xdist_order import chunk_sizes, reorder


@dataclass
class FakeItem:
    """The parts of a pytest.Item that xdist_order reads."""

    nodeid: str
    integration: bool = False
    scopes: tuple[str, ...] = ()
    _fixtureinfo: Any = field(init=False)

    def __post_init__(self) -> None:
        defs = {f"f{i}": [SimpleNamespace(scope=scope)] for i, scope in enumerate(self.scopes)}
        self._fixtureinfo = SimpleNamespace(name2fixturedefs=defs)

    def get_closest_marker(self, name: str) -> object | None:
        return object() if name == "integration" and self.integration else None


def _reordered(items: list[FakeItem], workers: int, durations: dict[str, float]) -> list[str]:
    as_items = cast(list[pytest.Item], list(items))
    reorder(as_items, workers, durations)
    return [item.nodeid for item in as_items]


def test_chunk_sizes_are_worksteals_even_split() -> None:
    assert chunk_sizes(10, 4) == [2, 2, 3, 3]
    assert chunk_sizes(3883, 4) == [970, 971, 971, 971]
    assert sum(chunk_sizes(7, 3)) == 7


def test_each_chunk_starts_with_a_long_test_and_the_load_is_balanced() -> None:
    durations = {"i.py::a": 100.0, "i.py::b": 90.0, "i.py::c": 50.0, "i.py::d": 40.0}
    items = [FakeItem(f"i.py::{n}", integration=True) for n in "abcd"]
    items += [FakeItem(f"u.py::t{n}") for n in range(8)]
    order = _reordered(items, 2, durations)
    first, second = order[:6], order[6:]
    assert sorted(order) == sorted(item.nodeid for item in items), "every test once"
    assert {first[0], second[0]} == {"i.py::a", "i.py::b"}
    loads = [sum(durations.get(n, 0.05) for n in chunk) for chunk in (first, second)]
    assert abs(loads[0] - loads[1]) <= 20.0, loads


def test_tests_sharing_a_module_fixture_stay_together_in_file_order() -> None:
    shared = [FakeItem(f"m.py::s{n}", scopes=("module",)) for n in range(3)]
    alone = [FakeItem(f"a.py::t{n}", scopes=("function", "session")) for n in range(3)]
    durations = {"m.py::s2": 30.0, "a.py::t0": 20.0, "a.py::t1": 10.0}
    order = _reordered([*alone, *shared], 2, durations)
    at = order.index("m.py::s0")
    assert order[at : at + 3] == ["m.py::s0", "m.py::s1", "m.py::s2"]
    assert order[0] == "m.py::s0", "the longest group goes first"
