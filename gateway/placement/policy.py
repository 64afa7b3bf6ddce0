"""Model placement by demand: which board to switch to which model, as a pure decision over a snapshot.

Owns the rules of docs/models.md ("Placement by demand") and nothing else: no I/O, no clock of its
own, no switching. The placement loop (`placer.py`) snapshots the fleet (`BoardSlot` per one-model
board), the demand per catalog model (`Demand`) and the catalog, asks `next_switch`, and carries
the answer out as a compare-and-swap switch on the board (`Load` with `switch_from`), so two
gateway replicas deciding at once switch a board at most once.

The rules, in order:
- A model with waiting requests and no ready board is *starved*; the most starved (most
  waiting, then highest priority, then alias) gets a board first.
- Otherwise a model with requests waiting beyond its boards' lanes and fewer boards than its
  `max_boards` is *pressed*; it may grow by a board whose model has had no request for
  `idle_ttl_s` (the hysteresis: a board leaves a model only once that model has gone quiet).
  Nothing else moves a board, so a model keeps its boards while it has demand.
- A board is a candidate only if: an operator has not pinned or drained it; its model has been
  ready for at least `min_residency_s` (so a board switches at most once per residency window:
  A B A A C traffic cannot thrash it); taking it leaves its model at or above `min_boards`; and
  it has no request in flight, unless its model has seen no request for `idle_ttl_s`.
- Of the candidates, the board the fleet misses least goes: the one whose model has the least
  demand per remaining board, then the lowest priority, then the longest resident, then target.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from calculet.gateway.fleet.catalog import CatalogModel


@dataclass(frozen=True)
class BoardSlot:
    """One board that holds one model, as placement sees it.

    Attributes:
        target: the board's address.
        model / generation: what it serves now (None: nothing).
        ready_at: monotonic seconds when that generation became ready.
        in_flight: requests running on it.
        held: an operator pinned or drained it: placement never switches it.
    """

    target: str
    model: str | None
    generation: int
    ready_at: float
    in_flight: int = 0
    held: bool = False


@dataclass(frozen=True)
class Demand:
    """One model's demand: requests waiting (for a board in the gateway's queue, or for a lane on
    its boards), running, and when the last one arrived."""

    waiting: int = 0
    running: int = 0
    last_request_at: float = float("-inf")


@dataclass(frozen=True)
class PlacementPolicy:
    """Attributes: min_residency_s (a fresh model stays this long), idle_ttl_s (a busy board may be
    taken once its model has had no request for this long)."""

    min_residency_s: float = 60.0
    idle_ttl_s: float = 300.0


@dataclass(frozen=True)
class SwitchPlan:
    """Switch `target` from `from_model`@`from_generation` to `to_model` (compare-and-swap)."""

    target: str
    from_model: str | None
    from_generation: int
    to_model: str
    reason: str


def next_switch(
    now: float,
    boards: Sequence[BoardSlot],
    demand: Mapping[str, Demand],
    catalog: Sequence[CatalogModel],
    policy: PlacementPolicy,
) -> SwitchPlan | None:
    """The one switch to make now, or None (see the module docstring for the rules).

    Args:
        now: monotonic seconds, the clock of `ready_at` and `last_request_at`.
        boards: every one-model board of the fleet.
        demand: per catalog alias; a missing alias has none.
        catalog: the models placement may serve (others are never placed, never evicted below min).
    """
    models = {m.alias: m for m in catalog}
    serving = _boards_per_model(boards)
    starved = [alias for alias in models if demand.get(alias, Demand()).waiting > 0 and serving.get(alias, 0) == 0]
    if starved:
        want = min(starved, key=lambda a: (-demand[a].waiting, -models[a].priority, a))
        candidates = [b for b in boards if _may_take(b, now, serving, demand, models, policy)]
        reason = f"{want}: {demand[want].waiting} request(s) waiting and no board"
    else:
        pressed = [a for a in models if demand.get(a, Demand()).waiting > 0 and _below_max(models[a], serving)]
        if not pressed:
            return None
        want = min(pressed, key=lambda a: (-demand[a].waiting / serving.get(a, 1), -models[a].priority, a))
        candidates = [
            b
            for b in boards
            if b.model != want
            and _idle_for(b, now, demand) >= policy.idle_ttl_s
            and _may_take(b, now, serving, demand, models, policy)
        ]
        reason = f"{want}: {demand[want].waiting} request(s) waiting beyond its {serving.get(want, 0)} board(s)"
    if not candidates:
        return None
    board = min(candidates, key=lambda b: _miss(b, serving, demand, models))
    return SwitchPlan(board.target, board.model, board.generation, want, reason)


def _below_max(model: CatalogModel, serving: Mapping[str, int]) -> bool:
    return model.max_boards == 0 or serving.get(model.alias, 0) < model.max_boards


def _idle_for(board: BoardSlot, now: float, demand: Mapping[str, Demand]) -> float:
    if board.model is None:
        return float("inf")
    return now - demand.get(board.model, Demand()).last_request_at


def _boards_per_model(boards: Sequence[BoardSlot]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for b in boards:
        if b.model is not None:
            counts[b.model] = counts.get(b.model, 0) + 1
    return counts


def _may_take(
    board: BoardSlot,
    now: float,
    serving: Mapping[str, int],
    demand: Mapping[str, Demand],
    models: Mapping[str, CatalogModel],
    policy: PlacementPolicy,
) -> bool:
    if board.held or board.target in {t for m in models.values() for t in m.pinned}:
        return False
    if board.model is None:
        return True
    if now - board.ready_at < policy.min_residency_s:
        return False
    entry = models.get(board.model)
    if entry is not None and serving.get(board.model, 0) - 1 < entry.min_boards:
        return False
    return board.in_flight == 0 or _idle_for(board, now, demand) >= policy.idle_ttl_s


def _miss(
    board: BoardSlot, serving: Mapping[str, int], demand: Mapping[str, Demand], models: Mapping[str, CatalogModel]
) -> tuple[float, int, float, str]:
    """How much the fleet would miss `board` (smaller: take it first)."""
    if board.model is None:
        return (-1.0, 0, board.ready_at, board.target)
    d = demand.get(board.model, Demand())
    left = serving.get(board.model, 1) - 1
    per_board = (d.waiting + d.running) / left if left > 0 else float("inf")
    priority = models[board.model].priority if board.model in models else 0
    return (per_board, priority, board.ready_at, board.target)
