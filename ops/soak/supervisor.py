"""The harness as systemd and as an operator: keeps every board of the soak fleet running.

- **Restart** (systemd's `Restart=`): whenever a board process exits, whatever its status (a
  SIGKILL, exit 75 after a lost device, a crash), its exit is recorded and it is started again on
  the same socket after `RESTART_DELAY_S` (doubling, up to `MAX_RESTART_DELAY_S`, while restarts
  fail in a row). The gateway exiting is fatal: the run stops.
- **Liveness** (Kubernetes' liveness probe): a board whose `calculet.liveness` reads NOT_SERVING
  for `LOST_GRACE_S` (a lost device the daemon does not exit for), or whose process runs but does
  not answer for `UNREACHABLE_S`, is stopped with SIGTERM (SIGKILL after `STOP_GRACE_S`), then
  restarted as above; recorded with the reason.
- **Operator**: a board drained by a submit-error streak is resumed after `RESUME_AFTER_S`, as
  `calctl resume` would; a board past its automatic-reset budget gets an operator CCU reset (and
  is reported: the budget is sized so that the fault plan never exhausts it); a board NOT_SERVING
  for any other reason for `STUCK_S` while no operation is under way (`busy`, e.g. a rollout) is
  restarted, and reported (`record.stuck`): it did not recover by itself.
- **Audit**: every `STATUS_EVERY_S` each board's Status goes to the `AuditBook`; also right before
  the harness stops or kills a board.
- **The fleet's state** for `chaos`: whether it is whole (every board running and SERVING, and the
  gateway's `GET /ready` routing the model to all of them: a board the daemon calls SERVING takes
  the gateway a moment more), and when each board was last seen out of service.

Runs as one task on the event loop of the thread that started the fleet (restarts spawn children,
whose parent-death signal follows that thread); blocking gRPC calls go to worker threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from calculet.ops.fleet import Child, FleetError, LocalFleet, exit_text
from calculet.ops.soak.audit import AuditBook
from calculet.ops.soak.board_probe import (
    BoardProbe,
    gateway_routes,
    probe_board,
    read_status,
    reset_board,
    resume_board,
)
from calculet.ops.soak.timeline import Timeline

TICK_S = 0.25
HEALTH_EVERY_S = 1.0
STATUS_EVERY_S = 5.0
RESTART_DELAY_S = 1.0
MAX_RESTART_DELAY_S = 30.0
LOST_GRACE_S = 10.0
UNREACHABLE_S = 60.0  # longer than a start-up: a restarted daemon listens once its model is Ready
STOP_GRACE_S = 20.0
RESUME_AFTER_S = 3.0
STUCK_S = 120.0
STREAK_REASON = "consecutive submit errors"


@dataclass
class ExitRecord:
    """A board process that ended, and its restart."""

    t_s: float
    board: str
    pid: int
    returncode: int
    cause: str  # "exited by itself", "SIGKILL (fault)", or the harness's reason for stopping it
    restarted_s: float | None = None
    restarted_pid: int | None = None
    serving_again_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        def r(v: float | None) -> float | None:
            return None if v is None else round(v, 3)

        return {
            "t_s": r(self.t_s),
            "board": self.board,
            "pid": self.pid,
            "returncode": self.returncode,
            "exit": exit_text(self.returncode),
            "cause": self.cause,
            "restarted_s": r(self.restarted_s),
            "restarted_pid": self.restarted_pid,
            "serving_again_s": r(self.serving_again_s),
        }


@dataclass
class OperatorAction:
    """Something the harness did to a live board as an operator would."""

    t_s: float
    board: str
    pid: int
    action: str
    reason: str
    result: str = ""

    def to_json(self) -> dict[str, Any]:
        return {**self.__dict__, "t_s": round(self.t_s, 3)}


@dataclass
class _Board:
    index: int
    name: str
    target: str
    serving: bool = False
    restart_at: float | None = None
    failures_in_row: int = 0
    not_live_since: float | None = None
    unreachable_since: float | None = None
    streak_since: float | None = None
    stuck_since: float | None = None
    stop_cause: str | None = None  # set while the harness stops it
    kill_at: float | None = None
    budget_reported_pid: int | None = None
    last_exit: ExitRecord | None = None
    last_probe: BoardProbe | None = None
    last_out_s: float = float("-inf")  # when it was last seen out of service (exited, not SERVING)


@dataclass
class _Counters:
    exits: list[ExitRecord] = field(default_factory=list)
    actions: list[OperatorAction] = field(default_factory=list)
    budget_exhausted: list[str] = field(default_factory=list)
    stuck: list[str] = field(default_factory=list)
    fatal: list[str] = field(default_factory=list)


class Supervisor:
    """Watches one `LocalFleet` (module docstring). The fleet must have been started.

    Args:
        fleet: the soak fleet.
        audit: where Status reads go.
        timeline: the run's clock.
        say: one-line progress output.
        on_fatal: called when the gateway stops (the run cannot go on).
    """

    def __init__(
        self,
        fleet: LocalFleet,
        audit: AuditBook,
        timeline: Timeline,
        say: Callable[[str], None],
        on_fatal: Callable[[], None] | None = None,
    ) -> None:
        self.fleet = fleet
        self.on_fatal = on_fatal
        self.audit = audit
        self.timeline = timeline
        self.say = say
        self.boards = [_Board(i, d.name, fleet.targets[i]) for i, d in enumerate(fleet.daemons)]
        self.record = _Counters()
        self.routed: int | None = None  # boards the gateway routes the model to, at the last look
        self.busy: Callable[[], bool] = lambda: False  # an operation under way (chaos: a rollout)
        self._killed: dict[int, str] = {}  # pid -> cause, for kills a fault asked for

    # ------------------------------------------------------------------ queries

    def child(self, board: int) -> Child:
        return self.fleet.daemons[board]

    def whole(self) -> bool:
        """Every board running, not restarting, last seen SERVING, and routed to by the gateway."""
        running = all(b.serving and b.restart_at is None and self.child(b.index).alive() for b in self.boards)
        return running and self.routed == len(self.boards)

    def out_since(self, board: int, t_s: float) -> bool:
        """Whether board `board` was seen out of service at `t_s` or later."""
        return self.boards[board].last_out_s >= t_s

    def serving_boards(self) -> list[int]:
        return [b.index for b in self.boards if b.serving and self.child(b.index).alive()]

    async def wait_whole(self, timeout_s: float, stop: asyncio.Event | None = None) -> bool:
        """Wait until `whole()` (checked every tick), `timeout_s`, or `stop`; returns `whole()`."""
        deadline = self.timeline.now() + timeout_s
        while not self.whole() and self.timeline.now() < deadline and not (stop is not None and stop.is_set()):
            await asyncio.sleep(TICK_S)
        return self.whole()

    # ------------------------------------------------------------------ actions asked by faults

    async def sigkill(self, board: int, cause: str) -> int | None:
        """SIGKILL board `board`'s process (its Status read first); returns its pid, None when it was
        not running."""
        child = self.child(board)
        if not child.alive():
            return None
        await self._read_status(self.boards[board])
        pid = child.pid
        self._killed[pid] = cause
        child.signal_group(signal.SIGKILL)
        self._out(self.boards[board])
        return pid

    # ------------------------------------------------------------------ the loop

    async def run(self, stop: asyncio.Event) -> None:
        """Watch until `stop` is set (module docstring)."""
        next_health = next_status = self.timeline.now()
        while not stop.is_set():
            self._reap()
            self._restart_due()
            self._kill_overdue()
            now = self.timeline.now()
            if now >= next_health:
                next_health = now + HEALTH_EVERY_S
                await self._check_health()
            if now >= next_status:
                next_status = now + STATUS_EVERY_S
                await asyncio.gather(*(self._read_status(b) for b in self.boards if self.child(b.index).alive()))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), TICK_S)

    async def read_all(self) -> None:
        """Read every running board's Status into the audit (the end of the run)."""
        await asyncio.gather(*(self._read_status(b) for b in self.boards if self.child(b.index).alive()))

    def _reap(self) -> None:
        for ex in self.fleet.poll():
            now = self.timeline.now()
            if ex.role == "gateway":
                self.record.fatal.append(f"the gateway stopped: {ex.describe()}")
                self.say(f"soak: the gateway stopped ({exit_text(ex.returncode)})")
                if self.on_fatal is not None:
                    self.on_fatal()
                continue
            board = next(b for b in self.boards if b.name == ex.name)
            cause = self._killed.pop(ex.pid, None) or board.stop_cause or "exited by itself"
            board.stop_cause, board.kill_at = None, None
            self._out(board)
            board.not_live_since = board.streak_since = board.stuck_since = board.unreachable_since = None
            record = ExitRecord(now, ex.name, ex.pid, ex.returncode, cause)
            self.record.exits.append(record)
            board.last_exit = record
            delay = min(MAX_RESTART_DELAY_S, RESTART_DELAY_S * 2**board.failures_in_row)
            board.restart_at = now + delay
            self.say(f"soak: {ex.name} (pid {ex.pid}) {exit_text(ex.returncode)} [{cause}]; restart in {delay:g} s")

    def _restart_due(self) -> None:
        for board in self.boards:
            if board.restart_at is None or self.timeline.now() < board.restart_at:
                continue
            try:
                child = self.fleet.restart_daemon(board.index)
            except FleetError as err:
                board.failures_in_row += 1
                board.restart_at = self.timeline.now() + min(MAX_RESTART_DELAY_S, 2.0**board.failures_in_row)
                self.say(f"soak: restarting {board.name} failed: {err}")
                continue
            board.restart_at = None
            board.failures_in_row += 1  # until it reports SERVING
            if board.last_exit is not None:
                board.last_exit.restarted_s = self.timeline.now()
                board.last_exit.restarted_pid = child.pid

    def _kill_overdue(self) -> None:
        for board in self.boards:
            if board.kill_at is not None and self.timeline.now() >= board.kill_at:
                board.kill_at = None
                self.child(board.index).signal_group(signal.SIGKILL)

    async def _check_health(self) -> None:
        live = [b for b in self.boards if self.child(b.index).alive() and b.stop_cause is None]
        url, alias = self.fleet.base_url, self.fleet.config.model
        routed = asyncio.create_task(asyncio.to_thread(gateway_routes, url, alias))
        probes = await asyncio.gather(*(asyncio.to_thread(probe_board, b.target) for b in live))
        self.routed = await routed
        for board, probe in zip(live, probes, strict=True):
            await self._act_on(board, probe)

    async def _act_on(self, board: _Board, probe: BoardProbe) -> None:
        now = self.timeline.now()
        board.last_probe = probe
        if not self.child(board.index).alive() or board.stop_cause is not None:
            return
        was_serving, board.serving = board.serving, probe.reachable and probe.serving
        if not board.serving:
            board.last_out_s = now
        if board.serving:
            board.failures_in_row = 0
            board.not_live_since = board.streak_since = board.stuck_since = board.unreachable_since = None
            if not was_serving and board.last_exit is not None and board.last_exit.serving_again_s is None:
                board.last_exit.serving_again_s = now
            return
        if not probe.reachable:
            board.unreachable_since = board.unreachable_since if board.unreachable_since is not None else now
            if now - board.unreachable_since >= UNREACHABLE_S:
                await self._stop(board, f"no answer for {UNREACHABLE_S:g} s ({probe.error})")
            return
        board.unreachable_since = None
        if not probe.live:
            board.not_live_since = board.not_live_since if board.not_live_since is not None else now
            if now - board.not_live_since >= LOST_GRACE_S:
                await self._stop(board, f"liveness NOT_SERVING for {LOST_GRACE_S:g} s ({probe.reason or 'no reason'})")
            return
        board.not_live_since = None
        if STREAK_REASON in probe.reason:
            board.streak_since = board.streak_since if board.streak_since is not None else now
            if now - board.streak_since >= RESUME_AFTER_S:
                board.streak_since = None
                result = await asyncio.to_thread(resume_board, board.target)
                self._act(board, "resume", probe.reason, result)
            return
        pid = self.child(board.index).pid
        if probe.draining or self.busy():
            board.stuck_since = None
        else:
            board.stuck_since = board.stuck_since if board.stuck_since is not None else now
            if now - board.stuck_since >= STUCK_S and not probe.budget_exhausted:
                why = f"NOT_SERVING for {STUCK_S:g} s ({probe.reason or 'no reason'})"
                self.record.stuck.append(f"{board.name} (pid {pid}): {why}")
                await self._stop(board, why)
                return
        if probe.budget_exhausted and board.budget_reported_pid != pid:
            board.budget_reported_pid = pid
            self.record.budget_exhausted.append(f"{board.name} (pid {pid}): {probe.reason}")
            why = "soak harness: automatic-reset budget exhausted"
            result = await asyncio.to_thread(reset_board, board.target, why)
            self._act(board, "reset", probe.reason, result)

    async def _stop(self, board: _Board, why: str) -> None:
        """SIGTERM a board the harness gives up on (its Status read first); SIGKILL after a grace."""
        await self._read_status(board)
        board.stop_cause = f"stopped by the harness: {why}"
        board.kill_at = self.timeline.now() + STOP_GRACE_S
        self._out(board)
        self._act(board, "restart", why, "SIGTERM sent")
        self.child(board.index).signal_group(signal.SIGTERM)

    def _out(self, board: _Board) -> None:
        board.serving = False
        board.last_out_s = self.timeline.now()

    def _act(self, board: _Board, action: str, reason: str, result: str) -> None:
        pid = self.child(board.index).pid
        self.record.actions.append(OperatorAction(self.timeline.now(), board.name, pid, action, reason, result))
        self.say(f"soak: {action} {board.name} (pid {pid}): {reason} -> {result}")

    async def _read_status(self, board: _Board) -> None:
        child = self.child(board.index)
        pid = child.pid
        status = await asyncio.to_thread(read_status, board.target)
        if isinstance(status, str):
            self.audit.failed_read(board.name, pid, status)
        else:
            self.audit.observe(board.name, pid, status, self.timeline.now())
