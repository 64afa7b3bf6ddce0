"""The switch phase clock (`calculet.common.phase_clock`): the daemon's and the client's `ModelState`
time a switch alike, and states that bound no phase (the client's UNKNOWN among them) count for none."""

from __future__ import annotations

from enum import Enum

from calculet.client.types import ModelState as ClientModelState
from calculet.common.phase_clock import PHASES, PhaseClock
from calculet.daemon.core.model_state import ModelState as DaemonModelState

OLD, NEW = 1, 2
# The progress a switch from OLD to NEW streams, as (generation, state name), with one repeat.
PROGRESS = [
    (NEW, "validating"),
    (OLD, "draining"),
    (OLD, "draining"),
    (OLD, "unloading"),
    (OLD, "unloaded"),
    (NEW, "configuring"),
    (NEW, "warming"),
    (NEW, "ready"),
]


class Manual:
    """A clock the test sets: message i of PROGRESS arrives at second i, the end at len(PROGRESS)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def timed(state_type: type[Enum], extra: list[tuple[int, Enum]] | None = None) -> dict[str, float]:
    manual = Manual()
    clock = PhaseClock(OLD, clock=manual)
    for i, (generation, name) in enumerate(PROGRESS):
        manual.now = float(i)
        clock.seen(generation, state_type(name))
        for other in extra or []:
            clock.seen(*other)
    manual.now = float(len(PROGRESS))
    return clock.seconds()


def test_the_daemons_and_the_clients_states_time_a_switch_alike() -> None:
    daemon, client = timed(DaemonModelState), timed(ClientModelState)
    assert tuple(daemon) == PHASES
    assert daemon == client == {"validate": 1, "drain": 2, "unload": 1, "configure": 2, "warm": 1, "publish": 1}


def test_a_state_bounding_no_phase_counts_for_none() -> None:
    unknown = [(NEW, ClientModelState.UNKNOWN), (OLD, ClientModelState.UNKNOWN), (OLD, ClientModelState.READY)]
    assert timed(ClientModelState, unknown) == timed(ClientModelState)


def test_phases_that_have_not_begun_are_left_out() -> None:
    manual = Manual()
    clock = PhaseClock(OLD, clock=manual)
    manual.now = 2.0
    clock.seen(OLD, DaemonModelState.DRAINING)
    manual.now = 5.0
    assert clock.seconds() == {"validate": 2.0, "drain": 3.0}
