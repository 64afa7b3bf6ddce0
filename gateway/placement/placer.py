"""`ModelPlacer`: placement by demand, the loop around `policy.next_switch` (issue 20).

Owns the requests waiting for a model (`ModelWaiters`), what it remembers of the fleet between
decisions (when each board's generation was first seen ready, each model's last request, the
boards it is switching now, and the refusals boards gave), and the switch tasks it starts.

Data flow: a request for a catalog model that no board serves waits in `wait_for_board` (the
model's queue: 429 when full, 503 past the deadline, 400 at once when the model can never be
placed). The loop wakes on every fleet change (load reports, health, waiters entering and
leaving) and at least once a second, snapshots the boards (`board_slots`) and the demand
(`demand_of`), asks `next_switch`, and runs the answer as a compare-and-swap switch on the board
(`DaemonConnection.switch_model`). When the board reports the new model ready, its waiters route
to it like any request. Another gateway may decide the same board at once: the daemon lets one
switch through and answers ABORTED to the other, which simply decides again from the next report.

Ownership: the placer never undoes an operator's work: a board whose status is not SERVING
(drained, halted) or that holds two models is not in the snapshot; pinned boards are never
candidates (`next_switch`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from calculet.client.types import ModelState, ServingStatus
from calculet.common.errors import CalculetError, ErrorKind
from calculet.gateway.errors import ModelNotPlaceable, ModelWaitExpired
from calculet.gateway.fleet.board import Board, BoardState
from calculet.gateway.fleet.catalog import CatalogModel
from calculet.gateway.fleet.connection import ModelSwitch, SwitchDone
from calculet.gateway.fleet.fleet import Fleet
from calculet.gateway.placement.policy import BoardSlot, Demand, PlacementPolicy, SwitchPlan, next_switch
from calculet.gateway.placement.waiters import ModelWaiters, QueueBounds

log = logging.getLogger("calculet.gateway.placement")

TICK_S = 1.0  # the loop decides at least this often: residency and idle TTLs expire with time
DECISION_GAP_S = 0.05  # at most one decision per gap however many requests arrive
REFUSAL_TTL_S = 600.0  # a board's refusal of a package holds this long (an operator may fix it)
RETRY_S = 5.0  # a board that refused or failed a switch is left alone this long (or the residency)
SETTLE_S = 30.0  # a switch done counts as in place until the board's report shows it, this long at most
GONE = frozenset({ModelState.UNLOADED, ModelState.FAILED, ModelState.UNKNOWN})
# What a board answers when it will not take a package (invalid, does not fit, no operate token):
# remembered per board for REFUSAL_TTL_S; a model every board refuses is not placeable.
REFUSALS = frozenset({ErrorKind.FAILED_PRECONDITION, ErrorKind.PERMISSION_DENIED, ErrorKind.UNAUTHENTICATED})


class PlacementObserver:
    """What the placer reports (the gateway's metrics implement it; the default ignores all)."""

    def model_switched(self, model: str, result: str, seconds: float, phases: Mapping[str, float]) -> None:
        """A switch to `model` ended: `result` ok, lost (another switch won), refused or failed."""

    def model_waited(self, model: str, seconds: float, outcome: str) -> None:
        """A request waited `seconds` for `model`: `outcome` served, expired, refused, left (the
        client went away) or full (the queue was, and it never waited)."""


@dataclass(frozen=True)
class PlacerSettings:
    """Attributes: policy (residency, idle TTL), bounds (queue per model, wait), requester (who
    asks, for the boards' audit trails)."""

    policy: PlacementPolicy
    bounds: QueueBounds
    requester: str


class ModelPlacer:
    """Placement by demand (module docstring).

    Args:
        fleet: the boards (owned by the caller).
        catalog: the models placement may serve.
        settings: its bounds and policy.
        observer: metrics.
        clock: monotonic seconds (injectable for tests).
    """

    def __init__(
        self,
        fleet: Fleet,
        catalog: Sequence[CatalogModel],
        settings: PlacerSettings,
        observer: PlacementObserver | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._fleet = fleet
        self.catalog = {m.alias: m for m in catalog}
        self.settings = settings
        self.observer = observer or PlacementObserver()
        self._clock = clock
        self.waiters = ModelWaiters(settings.bounds, fleet.notify)
        self._started_at = clock()
        self._last_request: dict[str, float] = {}
        self._ready_since: dict[tuple[str, str, int], float] = {}
        self._looked: set[tuple[str, int]] = set()  # (target, epoch) of boards seen in a snapshot
        self.switching: dict[str, SwitchPlan] = {}  # target -> the switch this placer runs there
        self._settling: dict[str, tuple[float, SwitchPlan]] = {}  # done, not yet in the board's report
        self._resting: dict[str, float] = {}  # target -> until when a refused switch is not retried there
        self._refused: dict[str, dict[str, tuple[float, str]]] = {}  # alias -> target -> (when, why)
        self._task: asyncio.Task[None] | None = None
        self._switches: set[asyncio.Task[None]] = set()
        self._closing = False
        self._arrived = asyncio.Event()  # a request came: demand may have changed

    # ---- lifecycle -------------------------------------------------------------------

    def start(self) -> None:
        """Start the loop (inside the running event loop)."""
        self._task = asyncio.create_task(self._run(), name="model placement")

    async def close(self) -> None:
        """Stop deciding; switches in progress are left to finish on their boards."""
        # The flag as well as the cancel: Python 3.11's wait_for can swallow a cancel that lands
        # just as the fleet's change event fires (bpo-42130).
        self._closing = True
        tasks = [t for t in (self._task, *self._switches) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # ---- what requests call ------------------------------------------------------------

    def note_request(self, alias: str) -> None:
        """A request for `alias` arrived (its idle time starts again; the loop decides soon)."""
        self._last_request[alias] = self._clock()
        self._arrived.set()

    async def wait_for_board(self, alias: str, has_board: Callable[[], bool]) -> None:
        """Wait in `alias`'s queue until `has_board()` (module docstring).

        Raises:
            Overloaded: the queue is full.
            ModelNotPlaceable: no board can ever take the model (at once, or as soon as the last
                board refuses its package).
            ModelWaitExpired: no board served it within the wait bound.
        """
        self.note_request(alias)
        started, outcome = self._clock(), "full"
        try:
            with self.waiters.enter(alias):
                outcome = "left"  # until it ends otherwise: the client went away
                deadline = started + self.settings.bounds.wait_s
                while not has_board():
                    if (reason := self.refusal(alias)) is not None:
                        outcome = "refused"
                        raise ModelNotPlaceable(reason)
                    left = deadline - self._clock()
                    if left <= 0:
                        outcome = "expired"
                        raise ModelWaitExpired(
                            f"model {alias!r} got no board within {self.settings.bounds.wait_s:g} s",
                            retry_after_s=self.settings.bounds.wait_s,
                        )
                    await self._fleet.wait_changed(min(left, TICK_S))
                outcome = "served"
        finally:
            self.observer.model_waited(alias, self._clock() - started, outcome)

    def refusal(self, alias: str) -> str | None:
        """Why `alias` can never be placed now, or None: the catalog leaves it no board, or every
        board up refused its package (within `REFUSAL_TTL_S`)."""
        boards = [b for b in self._fleet.boards.values() if b.state is BoardState.UP]
        static = placement_impossible(alias, len(self._fleet.boards), self.catalog)
        if static is not None:
            return static
        now = self._clock()
        refused = {t: why for t, (at, why) in self._refused.get(alias, {}).items() if now - at < REFUSAL_TTL_S}
        if boards and all(b.target in refused for b in boards):
            detail = "; ".join(f"{t}: {why}" for t, why in sorted(refused.items()))
            return f"model {alias!r} cannot be placed: every board refused its package ({detail})"
        return None

    # ---- the decision ------------------------------------------------------------------

    def decide(self) -> SwitchPlan | None:
        """The switch to start now, from a snapshot of the fleet (none while the same model or
        board is already being switched by this placer)."""
        now = self._clock()
        boards = list(self._fleet.boards.values())
        moving = {**self.switching, **self._settled(now)}
        slots = board_slots(boards, now, self._ready_since, moving, self._looked)
        slots = [dataclasses.replace(s, held=True) if self._resting.get(s.target, 0.0) > now else s for s in slots]
        self._forget(now, boards)
        demand = {
            alias: demand_of(alias, boards, self.waiters.count(alias), self._last_seen(alias), now)
            for alias in self.catalog
        }
        for underway in moving.values():  # a model being placed is not starved twice
            demand[underway.to_model] = Demand(0, demand[underway.to_model].running, now)
        catalog = list(self.catalog.values())
        for _ in range(len(slots)):
            plan = next_switch(now, slots, demand, catalog, self.settings.policy)
            if plan is None or not self._refused_by(plan.to_model, plan.target, now):
                return plan
            # This board refused that package lately: leave it out and decide again.
            target = plan.target
            slots = [dataclasses.replace(s, held=True) if s.target == target else s for s in slots]
        return None

    def _forget(self, now: float, boards: Sequence[Board]) -> None:
        """Drop what no longer describes the fleet, so a gateway that runs for months and switches
        thousands of times keeps bounded state: readiness of generations its boards no longer
        report, looks at board epochs past, rests and refusals that expired."""
        present = {(b.target, m.alias, m.generation) for b in boards if b.report is not None for m in b.report.models}
        self._ready_since = {key: t for key, t in self._ready_since.items() if key in present}
        epochs = {(b.target, b.epoch) for b in boards}
        self._looked &= epochs
        self._resting = {target: until for target, until in self._resting.items() if until > now}
        for alias in list(self._refused):
            kept = {t: entry for t, entry in self._refused[alias].items() if now - entry[0] < REFUSAL_TTL_S}
            if kept:
                self._refused[alias] = kept
            else:
                del self._refused[alias]

    def _settled(self, now: float) -> dict[str, SwitchPlan]:
        """Switches done whose board has not reported the new model yet (at most `SETTLE_S`)."""
        for target, (at, plan) in list(self._settling.items()):
            board = self._fleet.boards.get(target)
            m = board.model(plan.to_model) if board is not None else None
            if board is None or (m is not None and m.ready) or now - at > SETTLE_S:
                del self._settling[target]
        return {target: plan for target, (_, plan) in self._settling.items()}

    def _refused_by(self, alias: str, target: str, now: float) -> bool:
        at_why = self._refused.get(alias, {}).get(target)
        return at_why is not None and now - at_why[0] < REFUSAL_TTL_S

    def _last_seen(self, alias: str) -> float:
        return self._last_request.get(alias, self._started_at)

    async def _run(self) -> None:
        while not self._closing:
            try:
                plan = self.decide()
                if plan is not None and plan.target not in self.switching:
                    self._launch(plan)
            except Exception:  # a bug here must not end placement for the process' lifetime
                log.exception("placement decision failed")
            await self._next_round()

    async def _next_round(self) -> None:
        """Wait for a fleet change, a request, or the tick; then a short gap, so a burst of
        requests makes one decision."""
        waits = [
            asyncio.ensure_future(self._fleet.wait_changed(TICK_S)),
            asyncio.ensure_future(self._arrived.wait()),
        ]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
        self._arrived.clear()
        await asyncio.sleep(DECISION_GAP_S)

    def _launch(self, plan: SwitchPlan) -> None:
        board = self._fleet.boards.get(plan.target)
        if board is None:
            return
        self.switching[plan.target] = plan
        task = asyncio.create_task(self._switch(board, plan), name=f"switch {plan.target}")
        self._switches.add(task)
        task.add_done_callback(self._switches.discard)

    async def _switch(self, board: Board, plan: SwitchPlan) -> None:
        entry = self.catalog[plan.to_model]
        switch = ModelSwitch(
            plan.to_model, entry.package, plan.from_model, plan.from_generation, plan.reason, self.settings.requester
        )
        started = self._clock()
        log.info(
            "switch %s: %s@%s -> %s (%s)",
            board.target,
            plan.from_model,
            plan.from_generation,
            plan.to_model,
            plan.reason,
        )
        result, phases = "failed", {}
        try:
            done: SwitchDone = await board.conn.switch_model(switch)
            result, phases = "ok", done.phases
            self._settling[plan.target] = (self._clock(), plan)
            log.info("switch %s: %s@%s serving (%s)", board.target, plan.to_model, done.generation, _phases(done))
        except CalculetError as err:
            result = self._failed(board, plan, err)
        finally:
            self.switching.pop(plan.target, None)
            self.observer.model_switched(plan.to_model, result, self._clock() - started, phases)
            self._fleet.notify()

    def _failed(self, board: Board, plan: SwitchPlan, err: CalculetError) -> str:
        """Classify and remember a failed switch; returns its metric result. A lost race is decided
        again from the next report; any other failure leaves the board alone for a while."""
        if err.kind is ErrorKind.ABORTED:
            log.info("switch %s to %s: lost the race (%s)", board.target, plan.to_model, err)
            return "lost"
        self._resting[board.target] = self._clock() + max(RETRY_S, self.settings.policy.min_residency_s)
        if err.kind is ErrorKind.FAILED_PRECONDITION and "minimum residency" in str(err):
            log.info("switch %s to %s: %s", board.target, plan.to_model, err)  # the board's residency is longer
            return "refused"
        if err.kind not in REFUSALS:  # the board was unreachable or broke: try again after the rest
            log.warning("switch %s to %s failed: %s", board.target, plan.to_model, err)
            return "failed"
        log.warning("switch %s to %s refused: %s", board.target, plan.to_model, err)
        self._refused.setdefault(plan.to_model, {})[board.target] = (self._clock(), str(err))
        return "refused"


def _phases(done: SwitchDone) -> str:
    return ", ".join(f"{name} {seconds:.2f} s" for name, seconds in done.phases.items())


def board_slots(
    boards: Iterable[Board],
    now: float,
    ready_since: dict[tuple[str, str, int], float],
    switching: Mapping[str, SwitchPlan],
    looked: set[tuple[str, int]] | None = None,
) -> list[BoardSlot]:
    """The boards placement may consider (module docstring), each as a `BoardSlot`; records in
    `ready_since` when each (board, alias, generation) was first seen ready: now, or, for what a
    board already served at its first look (`looked`: (target, epoch) seen before, updated here),
    long ago: its age is unknown, and the board itself refuses a switch within its own minimum
    residency (then `ModelPlacer` counts it fresh)."""
    slots = []
    for board in boards:
        first_look = looked is not None and (board.target, board.epoch) not in looked
        if looked is not None and board.report is not None:
            looked.add((board.target, board.epoch))
        seen = float("-inf") if first_look else now
        report = board.report
        if board.state is not BoardState.UP or report is None or board.health is not ServingStatus.SERVING:
            continue
        if report.status is not ServingStatus.SERVING:
            continue  # drained or halted by an operator: never undone here
        present = [m for m in report.models if m.state not in GONE]
        plan = switching.get(board.target)
        if plan is not None:
            slots.append(BoardSlot(board.target, plan.to_model, 0, now, held=True))
        elif not present:
            slots.append(BoardSlot(board.target, None, 0, float("-inf")))
        elif len(present) == 1:
            m = present[0]
            since = ready_since.setdefault((board.target, m.alias, m.generation), seen) if m.ready else now
            slots.append(BoardSlot(board.target, m.alias, m.generation, since, board.jobs(m.alias), held=not m.ready))
    return slots


def demand_of(alias: str, boards: Iterable[Board], queued: int, last_request_at: float, now: float) -> Demand:
    """`alias`'s demand: `queued` requests waiting in the gateway plus jobs beyond its boards'
    lanes; running jobs; its last request (now while any board runs a job of it)."""
    running, beyond = 0, 0
    for board in boards:
        m = board.model(alias)
        if m is None or m.state in GONE:
            continue
        jobs = board.jobs(alias)
        running += jobs
        beyond += max(0, jobs - m.lanes_total)
    return Demand(queued + beyond, running, now if running else last_request_at)


def placement_impossible(alias: str, board_count: int, catalog: Mapping[str, CatalogModel]) -> str | None:
    """Why the catalog itself leaves `alias` no board (every board pinned or kept for other models'
    minimums), or None."""
    if alias not in catalog or board_count == 0:
        return None
    kept = sum(max(m.min_boards, len(m.pinned)) for a, m in catalog.items() if a != alias)
    if kept >= board_count:
        return (
            f"model {alias!r} cannot be placed: the catalog keeps all {board_count} board(s) for other models "
            f"(their min-boards and pinned boards add up to {kept})"
        )
    return None
