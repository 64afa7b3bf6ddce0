"""Model placement by demand (`next_switch`), a pure decision: a starved model gets the board the
fleet misses least; minimum boards, pins, residency and in-flight requests are respected; and
A B A A C traffic on two boards switches each board at most once per residency window."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from calculet.gateway.fleet.catalog import CatalogModel
from calculet.gateway.placement.policy import BoardSlot, Demand, PlacementPolicy, next_switch

POLICY = PlacementPolicy(min_residency_s=60.0, idle_ttl_s=300.0)
CATALOG = (CatalogModel("a", "pa"), CatalogModel("b", "pb"), CatalogModel("c", "pc"))
NOW = 1000.0


def board(target: str, model: str | None, ready_at: float = 0.0, **kw: object) -> BoardSlot:
    return BoardSlot(target, model, 1, ready_at, **kw)  # type: ignore[arg-type]


def test_nothing_moves_while_every_model_has_a_board_and_recent_requests() -> None:
    boards = [board("0", "a"), board("1", "b")]
    demand = {"a": Demand(waiting=50, last_request_at=NOW), "b": Demand(last_request_at=NOW - POLICY.idle_ttl_s + 1)}
    assert next_switch(NOW, boards, demand, CATALOG, POLICY) is None


def test_a_pressed_model_grows_only_onto_a_board_idle_past_the_ttl() -> None:
    boards = [board("0", "a"), board("1", "b")]
    idle_b = {"a": Demand(waiting=5, running=4, last_request_at=NOW), "b": Demand(last_request_at=NOW - 300)}
    plan = next_switch(NOW, boards, idle_b, CATALOG, POLICY)
    assert plan is not None and (plan.target, plan.from_model, plan.to_model) == ("1", "b", "a")
    assert "beyond its 1 board(s)" in plan.reason
    no_wait = {"a": Demand(running=4, last_request_at=NOW), "b": Demand(last_request_at=NOW - 300)}
    assert next_switch(NOW, boards, no_wait, CATALOG, POLICY) is None
    capped = (CatalogModel("a", "pa", max_boards=1), *CATALOG[1:])
    assert next_switch(NOW, boards, idle_b, capped, POLICY) is None


def test_a_starved_model_takes_the_board_missed_least() -> None:
    boards = [board("0", "a"), board("1", "a"), board("2", "b")]
    demand = {
        "a": Demand(running=1, last_request_at=NOW),
        "b": Demand(running=9, last_request_at=NOW),
        "c": Demand(waiting=3),
    }
    plan = next_switch(NOW, boards, demand, CATALOG, POLICY)
    assert plan is not None and (plan.target, plan.from_model, plan.to_model) == ("0", "a", "c")
    assert "3 request(s) waiting" in plan.reason


def test_an_empty_board_goes_first() -> None:
    boards = [board("0", "a"), board("1", None)]
    plan = next_switch(NOW, boards, {"c": Demand(waiting=1)}, CATALOG, POLICY)
    assert plan is not None and plan.target == "1" and plan.from_model is None


def test_min_boards_pins_holds_and_residency_are_respected() -> None:
    demand = {"c": Demand(waiting=1)}
    keep_a = (CatalogModel("a", "pa", min_boards=1), *CATALOG[1:])
    assert next_switch(NOW, [board("0", "a")], demand, keep_a, POLICY) is None
    pinned = (CatalogModel("a", "pa", pinned=("0",)), *CATALOG[1:])
    assert next_switch(NOW, [board("0", "a")], demand, pinned, POLICY) is None
    assert next_switch(NOW, [board("0", "a", held=True)], demand, CATALOG, POLICY) is None
    assert next_switch(NOW, [board("0", "a", ready_at=NOW - 59)], demand, CATALOG, POLICY) is None
    assert next_switch(NOW, [board("0", "a", ready_at=NOW - 60)], demand, CATALOG, POLICY) is not None


def test_a_busy_board_is_taken_only_once_its_model_is_idle_past_the_ttl() -> None:
    busy = [board("0", "a", in_flight=2)]
    recent = {"a": Demand(running=2, last_request_at=NOW - 10), "c": Demand(waiting=1)}
    assert next_switch(NOW, busy, recent, CATALOG, POLICY) is None
    stale = {"a": Demand(running=2, last_request_at=NOW - 300), "c": Demand(waiting=1)}
    assert next_switch(NOW, busy, stale, CATALOG, POLICY) is not None


def test_the_most_starved_model_goes_first_then_priority() -> None:
    boards = [board("0", None), board("1", None)]
    plan = next_switch(NOW, boards, {"b": Demand(waiting=2), "c": Demand(waiting=5)}, CATALOG, POLICY)
    assert plan is not None and plan.to_model == "c"
    ranked = (CatalogModel("a", "pa"), CatalogModel("b", "pb", priority=1), CatalogModel("c", "pc"))
    plan = next_switch(NOW, boards, {"b": Demand(waiting=2), "c": Demand(waiting=2)}, ranked, POLICY)
    assert plan is not None and plan.to_model == "b"


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abc"), st.floats(0.5, 40.0)), min_size=5, max_size=60))
def test_any_traffic_switches_a_board_at_most_once_per_residency_window(arrivals: list[tuple[str, float]]) -> None:
    """Requests (model, seconds after the previous) on two boards; each one waits (for a board, or
    beyond its model's lanes), each switch happens at once and serves what waits. No board may
    switch twice within `min_residency_s`."""
    now = 0.0
    boards = {"0": board("0", "a", -1e9), "1": board("1", "b", -1e9)}
    switches: dict[str, list[float]] = {"0": [], "1": []}
    last: dict[str, float] = {}
    for model, gap in arrivals:
        now += gap
        last[model] = now
        serving = {b.model for b in boards.values()}
        demand = {
            m: Demand(waiting=1 if m == model else 0, running=int(m in serving), last_request_at=t)
            for m, t in last.items()
        }
        plan = next_switch(now, list(boards.values()), demand, CATALOG, POLICY)
        if plan is not None:
            switches[plan.target].append(now)
            boards[plan.target] = board(plan.target, plan.to_model, now)
    for times in switches.values():
        assert all(later - earlier >= POLICY.min_residency_s for earlier, later in itertools.pairwise(times))
