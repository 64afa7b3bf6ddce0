"""The reset controller's lifecycles (issue 21 item 4): `ResetState`, which reset the board runs (one at
a time, held by the `ResetGate`), and `BoardHalt`, why it stopped serving on its own. Each is an Enum
with a transition table, changed only by `Lifecycle.move`.

- Each table is exactly the documented one (`resets/controller.py`, docs/daemon.md).
- Any sequence of moves follows the table or raises `IllegalTransition` and changes nothing
  (Hypothesis), on the bare lifecycle and through the gate's operations checked against a model.
- On a running DeviceCore over calsim: an operator reset passes OPERATOR_CCU or
  OPERATOR_CONFIGURATION, then SETTLING, then IDLE; a hung job's reset AUTOMATIC_CCU then IDLE, with
  launches held around the device call; a used-up budget halts the board (AWAITING_OPERATOR) without
  a reset, until an operator reset lifts the halt; a lost device is LOST until a reset that restores
  it (which calsim's lost device never allows) or a restart.
"""

from __future__ import annotations

from enum import Enum
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from calculet.common.errors import ErrorKind, FailedPrecondition, IllegalTransition
from calculet.common.lifecycle import Lifecycle
from calculet.daemon.calsim.faults import Fault, FaultKind
from calculet.daemon.core.events import FinishReason
from calculet.daemon.core.resets.budget import (
    HALT_TRANSITIONS,
    RESET_TRANSITIONS,
    BoardHalt,
    ResetGate,
    ResetState,
    ResetTally,
)

from .engine_factories import build_models, finish, request, running_core, until

S = ResetState
H = BoardHalt

# The documented tables, written out edge by edge.
RESET_EDGES = {
    S.IDLE: {S.AUTOMATIC_CCU, S.AUTOMATIC_CONFIGURATION, S.OPERATOR_CCU, S.OPERATOR_CONFIGURATION},
    # A hung job's reset does not settle (nobody waits for an answer); an escalation's does, for its audit.
    S.AUTOMATIC_CCU: {S.SETTLING, S.IDLE},
    S.AUTOMATIC_CONFIGURATION: {S.SETTLING, S.IDLE},
    S.OPERATOR_CCU: {S.SETTLING, S.IDLE},  # IDLE at once only when an unexpected error ends it
    S.OPERATOR_CONFIGURATION: {S.SETTLING, S.IDLE},
    S.SETTLING: {S.IDLE},
}
HALT_EDGES = {
    H.NONE: {H.AWAITING_OPERATOR, H.LOST},
    H.AWAITING_OPERATOR: {H.NONE, H.LOST},  # an operator reset lifts it; a lost device makes it LOST
    H.LOST: {H.NONE},  # the unhealthy escalation's device reset, when the device answers again
}
BEGINNINGS = (S.AUTOMATIC_CCU, S.AUTOMATIC_CONFIGURATION, S.OPERATOR_CCU, S.OPERATOR_CONFIGURATION)
TIMEOUT = 20.0


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_models(tmp_path_factory.mktemp("models"))


def test_the_tables_are_the_documented_ones() -> None:
    assert {state: set(RESET_TRANSITIONS.get(state, ())) for state in ResetState} == RESET_EDGES
    assert {state: set(HALT_TRANSITIONS.get(state, ())) for state in BoardHalt} == HALT_EDGES


@pytest.mark.parametrize(("transitions", "edges", "initial"), [
    (RESET_TRANSITIONS, RESET_EDGES, S.IDLE), (HALT_TRANSITIONS, HALT_EDGES, H.NONE)
])  # fmt: skip
def test_every_legal_edge_moves_and_every_other_raises(transitions: dict, edges: dict, initial: Enum) -> None:
    for source, targets in edges.items():
        for target in type(initial):
            life = Lifecycle("reset controller", source, transitions)
            if target in targets:
                assert life.move(target) is source and life.state is target
            else:
                with pytest.raises(IllegalTransition, match=f"{source.name} -> {target.name}"):
                    life.move(target)
                assert life.state is source, "an illegal move changes nothing"


@given(
    resets=st.lists(st.sampled_from(list(ResetState)), max_size=30),
    halts=st.lists(st.sampled_from(list(BoardHalt)), max_size=30),
)
def test_any_sequence_of_moves_follows_the_tables_or_raises(resets: list[S], halts: list[H]) -> None:
    for transitions, edges, initial, targets in (
        (RESET_TRANSITIONS, RESET_EDGES, S.IDLE, resets),
        (HALT_TRANSITIONS, HALT_EDGES, H.NONE, halts),
    ):
        life: Lifecycle[Enum] = Lifecycle("reset controller", initial, transitions)
        for target in targets:
            before = life.state
            if target in edges[before]:
                life.move(target)
                assert life.state is target
            else:
                with pytest.raises(IllegalTransition):
                    life.move(target)
                assert life.state is before


class GateMachine(RuleBasedStateMachine):
    """The gate's operations (begin, settle, end) against a model of the documented table: one reset
    at a time, a refused begin changes nothing, holder and tally live exactly as long as the reset."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = ResetGate()
        self.state = S.IDLE
        self.holder = ""
        self.tally: ResetTally | None = None

    @rule(state=st.sampled_from(list(ResetState)), with_tally=st.booleans())
    def begin(self, state: S, with_tally: bool) -> None:
        tally = ResetTally() if with_tally else None
        if self.state is not S.IDLE:
            assert not self.gate.try_begin("another reset", tally, state), "a second reset is refused"
        elif state in BEGINNINGS:
            assert self.gate.try_begin(state.name, tally, state)
            self.state, self.holder, self.tally = state, state.name, tally
        else:
            with pytest.raises(IllegalTransition):
                self.gate.try_begin(state.name, tally, state)

    @rule()
    def settle(self) -> None:
        if self.state in BEGINNINGS:
            self.gate.settle()
            self.state = S.SETTLING
        else:
            with pytest.raises(IllegalTransition):
                self.gate.settle()

    @rule()
    def end(self) -> None:
        if self.state is not S.IDLE:
            self.gate.end()
            self.state, self.holder, self.tally = S.IDLE, "", None
        else:
            with pytest.raises(IllegalTransition):
                self.gate.end()

    @invariant()
    def the_gate_agrees_with_the_model(self) -> None:
        assert self.gate.state is self.state
        assert self.gate.busy == (self.state is not S.IDLE)
        assert self.gate.holder == self.holder and self.gate.tally is self.tally


TestGateMachine = GateMachine.TestCase
TestGateMachine.settings = settings(max_examples=200, stateful_step_count=30, deadline=None)


# ---- the states a running board passes --------------------------------------------------------------


@pytest.mark.parametrize(("kind", "first"), [("ccu", S.OPERATOR_CCU), ("configuration", S.OPERATOR_CONFIGURATION)])
def test_an_operator_reset_passes_its_kind_then_settling_then_idle(models: Path, kind: str, first: S) -> None:
    with running_core(models) as core:
        resets = core.engine.resets
        seen: list[S] = []
        succeeded, note = resets.operator_reset_succeeded, resets.note_outcome

        def at_success() -> object:
            seen.append(resets.state)
            return succeeded()

        def at_outcome(kind: str, ok: bool) -> None:
            seen.append(resets.state)
            note(kind, ok)

        resets.operator_reset_succeeded = at_success  # type: ignore[method-assign]
        resets.note_outcome = at_outcome  # type: ignore[method-assign]
        assert resets.state is S.IDLE
        assert core.reset(kind, "states")[0]
        assert seen == [first, S.SETTLING]
        assert resets.state is S.IDLE and resets.halt is H.NONE


def test_a_refused_operator_reset_leaves_the_state_alone(models: Path) -> None:
    with running_core(models) as core:
        resets = core.engine.resets
        tally = resets.begin_operator_reset("configuration", "first")
        assert resets.state is S.OPERATOR_CONFIGURATION
        with pytest.raises(FailedPrecondition, match="reset in progress"):
            core.reset("ccu", "second")
        assert resets.state is S.OPERATOR_CONFIGURATION
        resets.wait_settled(tally, 0.0)
        assert resets.state is S.SETTLING
        resets.end()
        assert resets.state is S.IDLE
        assert core.reset("ccu", "next")[0]


def test_a_hung_job_is_reset_in_automatic_ccu_with_launches_held(models: Path) -> None:
    with running_core(models, fault_injection=True, job_timeout_s=0.3) as core:
        resets = core.engine.resets
        seen: list[tuple[S, bool]] = []
        reset_ccu = core.device.reset_ccu

        def observed() -> None:
            seen.append((resets.state, resets.launches_held))
            reset_ccu()

        core.device.reset_ccu = observed  # type: ignore[method-assign]
        core.inject_fault(Fault(FaultKind.HANG))
        assert finish(core, core.submit(request((4, 5, 6), 6, seed=1)).job_id)[1].reason is FinishReason.LENGTH
        assert seen == [(S.AUTOMATIC_CCU, True)]
        assert resets.state is S.IDLE and not resets.launches_held and resets.halt is H.NONE


def test_a_used_up_budget_halts_without_a_reset_until_an_operator_reset_lifts_it(models: Path) -> None:
    with running_core(models, fault_injection=True, job_timeout_s=0.3) as core:
        resets = core.engine.resets
        core.set_reset_budget(0)
        core.inject_fault(Fault(FaultKind.HANG))
        _, final = finish(core, core.submit(request((4, 5, 6), 6, seed=1)).job_id)
        assert final.error_kind is ErrorKind.UNAVAILABLE
        assert resets.halt is H.AWAITING_OPERATOR and resets.state is S.IDLE
        assert core.status().reset_history[-1].fault == "budget exhausted"
        assert core.reset("ccu", "lift the halt")[0]
        assert resets.halt is H.NONE and resets.state is S.IDLE and core.health().serving


def test_a_lost_device_is_lost_for_good(models: Path) -> None:
    with running_core(models, fault_injection=True) as core:
        resets = core.engine.resets
        core.inject_fault(Fault(FaultKind.DEVICE_LOST))
        _, final = finish(core, core.submit(request((4, 5, 6), 6, seed=1)).job_id)
        assert final.error_kind is ErrorKind.UNAVAILABLE
        until("the board halted", lambda: resets.halt is H.LOST, TIMEOUT)
        # The unhealthy escalation tries a configuration reset first (calsim's lost device fails it).
        assert core.wait_escalations(TIMEOUT)
        report = core.operator_reset("ccu", "too late")
        assert not report.ok and resets.halt is H.LOST and resets.state is S.IDLE
