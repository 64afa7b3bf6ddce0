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
- `rollout`: `rollout_action.run_rollout` in a task of its own, to the other package directory.

Every fault becomes a `FaultRecord` (planned and acted time, board, pid, job indices, what
happened). What the daemons did about them is read from their audit trails (`audit`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
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
from calculet.ops.soak.timeline import Timeline

GATE_S = 90.0
EFFECT_S = 30.0
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
    outcome: str = "pending"  # injected, killed, rolled out, rollout failed, skipped, failed
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
    ) -> None:
        self.plan = list(plan)
        self.supervisor = supervisor
        self.timeline = timeline
        self.alias = alias
        self.packages = packages
        self.gateway_url = gateway_url
        self.log_dir = log_dir
        self.say = say
        self.records: list[FaultRecord] = []
        self._rollouts = 0
        self._rollout_task: asyncio.Task[None] | None = None
        self._effect: tuple[int, float] | None = None  # (board, acted at) of a fault yet to take effect
        supervisor.busy = lambda: self.rollout_running

    @property
    def rollout_running(self) -> bool:
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
