"""Playing the fault plan against the live soak fleet, on the run's clock.

For each `PlannedFault`, in order: wait until its time; a disruptive one (`fault_plan.DISRUPTIVE`)
then waits until the previous disruptive fault has taken effect (a lost device or a submit-error
streak fires only when the board reaches its job index: until the board was seen out of service,
at most `EFFECT_S`) and the fleet is whole again (every board SERVING and routed to by the
gateway, no rollout running), at most `GATE_S`, so that one board is out at a time; else it is
skipped (recorded). A per-board fault whose board is not running goes to a serving board instead
(recorded). Then it acts:

- device faults: `injector.plan_on_board` (bursts on consecutive or near indices);
- `sigkill`: `Supervisor.sigkill` (the supervisor restarts the board);
- `rollout`: `rollout_action.run_rollout` in a task of its own, to the other package directory;
- `model_switch` (a `--models A,B` fleet): in a task of its own, `switch_action.switch_board` to
  B, then a burst of B's requests (`SwitchFault.burst`, judged like the others), then a wait of
  at most `RETURN_S` for the gateway's placement by demand to switch the board back to A (A has
  requests waiting on its one board, B has gone quiet for the soak gateway's `--idle-ttl`); if it
  did not, the harness switches it back as an operator would, and the record says which.

Every fault becomes a `FaultRecord` (planned and acted time, board, pid, job indices, what
happened). What the daemons did about them is read from their audit trails (`audit`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from calculet.client import CalculetError
from calculet.ops.soak.fault_plan import (
    CCU_BURST,
    DISRUPTIVE,
    NAN_BURST,
    NAN_SPACING,
    SUBMIT_STREAK,
    PlannedFault,
    SoakFault,
)
from calculet.ops.soak.injector import plan_on_board
from calculet.ops.soak.rollout_action import RolloutResult, run_rollout
from calculet.ops.soak.supervisor import Supervisor
from calculet.ops.soak.switch_action import serving_alias, switch_board
from calculet.ops.soak.timeline import Timeline

GATE_S = 90.0
EFFECT_S = 30.0
# The wait for placement by demand to switch a board back: the soak gateway's `--idle-ttl` and
# `--min-residency` (`fleets`) plus the switch itself, with room.
RETURN_S = 60.0
DELAYED_EFFECT = frozenset({SoakFault.DEVICE_LOST, SoakFault.SUBMIT_STREAK})
# kind -> (calsim fault, count, spacing between job indices)
DEVICE_FAULTS: dict[SoakFault, tuple[str, int, int]] = {
    SoakFault.CCU_EXCEPTION: ("ccu_exception", 1, 1),
    SoakFault.CCU_BURST: ("ccu_exception", CCU_BURST, 1),
    SoakFault.NAN_LOGITS: ("nan_logits", 1, 1),
    SoakFault.NAN_BURST: ("nan_logits", NAN_BURST, NAN_SPACING),
    SoakFault.SUBMIT_ERROR: ("submit_error", 1, 1),
    SoakFault.SUBMIT_STREAK: ("submit_error", SUBMIT_STREAK, 1),
    SoakFault.HANG: ("hang", 1, 1),
    SoakFault.DEVICE_LOST: ("device_lost", 1, 1),
}


@dataclass(frozen=True)
class SwitchFault:
    """What a `model_switch` fault needs (module docstring).

    Attributes:
        alias: the model switched to (B; its package directory has the same name).
        burst: sends B's requests through the gateway and waits for them; returns how many.
    """

    alias: str
    burst: Callable[[], Awaitable[int]]


@dataclass
class FaultRecord:
    """One planned fault and what became of it."""

    planned_s: float
    kind: str
    board: str | None
    cycle: int
    acted_s: float | None = None
    pid: int | None = None
    job_indices: list[int] = field(default_factory=list)
    outcome: str = "pending"  # injected, killed, rolled out, rollout failed, switched, skipped, failed
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        out["planned_s"] = round(self.planned_s, 3)
        out["acted_s"] = None if self.acted_s is None else round(self.acted_s, 3)
        return out


class Chaos:
    """Plays a fault plan (module docstring).

    Args:
        plan: the faults, in time order.
        supervisor: the soak fleet's supervisor (boards, SIGKILL, whether the fleet is whole).
        timeline: the run's clock.
        alias: the model alias (rollouts).
        packages: the two package directory names the rollouts alternate between (the boards
            start on the first).
        gateway_url: the soak gateway (rollouts find the boards through it).
        log_dir: where rollout logs go.
        say: one-line progress output.
        switch: the `model_switch` fault's model and burst (None: the plan has none).
    """

    def __init__(
        self,
        plan: Sequence[PlannedFault],
        supervisor: Supervisor,
        timeline: Timeline,
        *,
        alias: str,
        packages: tuple[str, str],
        gateway_url: str,
        log_dir: Path,
        say: Callable[[str], None],
        switch: SwitchFault | None = None,
    ) -> None:
        self.plan = list(plan)
        self.supervisor = supervisor
        self.timeline = timeline
        self.alias = alias
        self.packages = packages
        self.gateway_url = gateway_url
        self.log_dir = log_dir
        self.say = say
        self.switch = switch
        self.records: list[FaultRecord] = []
        self._rollouts = 0
        self._rollout_task: asyncio.Task[None] | None = None  # a rollout or a model switch
        self._effect: tuple[int, float] | None = None  # (board, acted at) of a fault yet to take effect
        supervisor.busy = lambda: self.rollout_running

    @property
    def rollout_running(self) -> bool:
        """A rollout or a model switch is under way (the fleet is not whole by design)."""
        return self._rollout_task is not None and not self._rollout_task.done()

    async def run(self, stop: asyncio.Event) -> None:
        """Play the plan until it ends or `stop` is set (faults not reached stay unrecorded)."""
        for fault in self.plan:
            delay = fault.at_s - self.timeline.now()
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)
            if stop.is_set():
                return
            board = None if fault.board is None else self.supervisor.boards[fault.board].name
            record = FaultRecord(fault.at_s, fault.kind.value, board, fault.cycle)
            self.records.append(record)
            await self._play(fault, record, stop)

    async def finish(self, timeout_s: float) -> None:
        """Wait for a rollout under way (cancelled after `timeout_s`)."""
        task = self._rollout_task
        if task is None or task.done():
            return
        try:
            await asyncio.wait_for(asyncio.shield(task), timeout_s)
        except TimeoutError:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _play(self, fault: PlannedFault, record: FaultRecord, stop: asyncio.Event) -> None:
        if fault.kind in DISRUPTIVE and not await self._gate(stop):
            record.outcome, record.note = "skipped", f"the fleet was not whole within {GATE_S:g} s"
            self.say(f"soak: {fault.kind.value} skipped ({record.note})")
            return
        if fault.kind is SoakFault.ROLLOUT:
            self._start_rollout(record)
            return
        assert fault.board is not None
        if fault.kind is SoakFault.MODEL_SWITCH:
            self._start_switch(fault.board, record)
            return
        board = self._target_board(fault.board, record)
        if board is None:
            record.outcome, record.note = "skipped", "no board was running"
            return
        record.board = self.supervisor.boards[board].name
        record.acted_s = acted = self.timeline.now()
        if fault.kind is SoakFault.SIGKILL:
            pid = await self.supervisor.sigkill(board, "SIGKILL (fault)")
            record.pid = pid
            record.outcome = "killed" if pid is not None else "skipped"
            return
        kind, count, spacing = DEVICE_FAULTS[fault.kind]
        target = self.supervisor.boards[board].target
        record.pid = self.supervisor.child(board).pid
        try:
            record.job_indices = await asyncio.to_thread(plan_on_board, target, kind, count, spacing)
            record.outcome = "injected" if len(record.job_indices) == count else "partly injected"
        except CalculetError as err:
            record.outcome, record.note = "failed", f"{err.kind.value}: {err}"
            return
        if fault.kind in DELAYED_EFFECT:
            self._effect = (board, acted)

    async def _gate(self, stop: asyncio.Event) -> bool:
        """Wait for the last disruptive fault's effect (at most `EFFECT_S`), then until the fleet is
        whole and no rollout runs (at most `GATE_S`)."""
        if self._effect is not None:
            board, acted = self._effect
            self._effect = None
            deadline = acted + EFFECT_S
            while not self.supervisor.out_since(board, acted) and self.timeline.now() < deadline:
                if stop.is_set():
                    return False
                await asyncio.sleep(0.25)
        deadline = self.timeline.now() + GATE_S
        while self.timeline.now() < deadline and not stop.is_set():
            if not self.rollout_running and self.supervisor.whole():
                return True
            await asyncio.sleep(0.25)
        return not self.rollout_running and self.supervisor.whole()

    def _target_board(self, planned: int, record: FaultRecord) -> int | None:
        """The planned board when it runs, else a serving one (noted), else None."""
        if self.supervisor.child(planned).alive():
            return planned
        serving = self.supervisor.serving_boards()
        if not serving:
            return None
        record.note = f"{self.supervisor.boards[planned].name} was restarting: moved"
        return serving[0]

    def _start_rollout(self, record: FaultRecord) -> None:
        self._rollouts += 1
        package = self.packages[self._rollouts % 2]
        log = self.log_dir / f"rollout-{self._rollouts}.log"
        record.acted_s = self.timeline.now()
        record.note = f"to {package}"
        self.say(f"soak: rollout {self._rollouts} to {package}")

        async def roll() -> None:
            result: RolloutResult = await run_rollout(self.alias, package, self.gateway_url, log)
            ok = result.returncode == 0
            record.outcome = "rolled out" if ok else "rollout failed"
            record.note = f"to {package} in {self.timeline.now() - (record.acted_s or 0):.1f} s"
            if not ok:
                record.note += f"; exit {result.returncode}; {result.log}:\n{result.tail}"
            self.say(f"soak: rollout {self._rollouts}: {record.outcome} ({record.note.splitlines()[0]})")

        record.outcome = "rolling out"
        self._rollout_task = asyncio.create_task(roll())

    def _start_switch(self, board: int, record: FaultRecord) -> None:
        """The `model_switch` fault, in a task of its own (module docstring)."""
        switch = self.switch
        if switch is None or not self.supervisor.child(board).alive():
            record.outcome, record.note = "skipped", "no second model" if switch is None else "board not running"
            return
        b = self.supervisor.boards[board]
        record.acted_s = self.timeline.now()
        record.pid = self.supervisor.child(board).pid
        record.outcome = "switching"
        self.say(f"soak: model switch of {b.name} to {switch.alias}")

        async def play() -> None:
            went = await asyncio.to_thread(switch_board, b.target, switch.alias, switch.alias, "soak: model_switch")
            if not went.startswith("switched"):
                record.outcome, record.note = "failed", went
                self.say(f"soak: model switch of {b.name}: {went}")
                return
            sent = await switch.burst()
            back = await self._switched_back(b.target, stop_at=self.timeline.now() + RETURN_S)
            if back:
                how = "placement switched it back"
            else:
                home = self.packages[self._rollouts % 2]
                how = "the harness switched it back: " + await asyncio.to_thread(
                    switch_board, b.target, self.alias, home, "soak: model_switch return"
                )
            record.outcome = "switched"
            record.note = f"{went}; {sent} request(s) of {switch.alias}; {how}"
            self.say(f"soak: model switch of {b.name}: {record.note}")

        self._rollout_task = asyncio.create_task(play())

    async def _switched_back(self, target: str, stop_at: float) -> bool:
        """Wait until the board serves the soak's model again (placement by demand), or `stop_at`."""
        while self.timeline.now() < stop_at:
            now = await asyncio.to_thread(serving_alias, target)
            if now is not None and now[0] == self.alias:
                return True
            await asyncio.sleep(1.0)
        return False
