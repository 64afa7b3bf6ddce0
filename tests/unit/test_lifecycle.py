"""Table-driven lifecycle: legal edges move, illegal edges raise, callbacks see every move."""

from enum import Enum, auto

import pytest
from hypothesis import given
from hypothesis import strategies as st

from calculet.common.errors import ErrorKind, IllegalTransition
from calculet.common.lifecycle import Lifecycle, table


class Light(Enum):
    RED = auto()
    GREEN = auto()
    YELLOW = auto()


EDGES = table([(Light.RED, [Light.GREEN]), (Light.GREEN, [Light.YELLOW]), (Light.YELLOW, [Light.RED])])


def test_legal_moves_follow_table_and_report_previous_state() -> None:
    seen: list[tuple[Light, Light]] = []
    lc = Lifecycle("light", Light.RED, EDGES, on_change=lambda a, b: seen.append((a, b)))
    assert lc.move(Light.GREEN) is Light.RED
    assert lc.move(Light.YELLOW) is Light.GREEN
    assert lc.state is Light.YELLOW
    assert seen == [(Light.RED, Light.GREEN), (Light.GREEN, Light.YELLOW)]


def test_illegal_move_raises_and_keeps_state() -> None:
    lc = Lifecycle("light", Light.RED, EDGES)
    with pytest.raises(IllegalTransition) as info:
        lc.move(Light.YELLOW)
    assert info.value.kind is ErrorKind.FAILED_PRECONDITION
    assert "RED -> YELLOW" in str(info.value)
    assert lc.state is Light.RED


@given(st.lists(st.sampled_from(list(Light)), max_size=30))
def test_any_sequence_either_follows_table_or_raises(targets: list[Light]) -> None:
    lc = Lifecycle("light", Light.RED, EDGES)
    for target in targets:
        before = lc.state
        if target in EDGES[before]:
            lc.move(target)
            assert lc.state is target
        else:
            with pytest.raises(IllegalTransition):
                lc.move(target)
            assert lc.state is before
