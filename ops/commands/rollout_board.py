"""One board of `calctl rollout`: drain, load the new package, resume, rejoin; not a command itself.

Steps (a `Lifecycle` over `RolloutStep`, one line printed per step):

    PENDING -> DRAINING   Drain RPC with the window: running jobs finish (or, with --interrupt, end
                          resumable elsewhere); jobs still running after it stop the rollout here.
            -> LOADING    Load RPC, replace=true, read to its last message: READY means validated,
                          configured and the golden check passed (published).
            -> RESTORING  only when the load failed and the alias no longer serves (a one-calbin
                          board unloads the old generation first): load the old package again.
            -> RESUMING   Resume RPC, always, whatever happened before: the board serves again, on
                          the new package or the old one.
            -> REJOINING  wait until traffic can reach the board again (`Rejoin`: the gateway routes
                          the alias to as many boards as before, or the daemon reports SERVING);
                          also after a failed load, once the old package serves again, so that the
                          fleet is whole when the rollout stops. Skipped when a call failed outright.
            -> DONE | FAILED

`BoardRollout.run()` returns None when the board serves the new package, else why the rollout must
stop (every failure of the board, in order). Typed errors of the calls become that reason; none is
swallowed. Data flow: `rollout.run` -> `BoardRollout(plan, ...).run()` per board, in order.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum

from calculet.client import DaemonClient
from calculet.common.errors import CalculetError
from calculet.common.lifecycle import Lifecycle, table
from calculet.ops.commands.access import DaemonAccess
from calculet.ops.commands.rollout_plan import BoardPlan
from calculet.v1 import common_pb2


class RolloutStep(Enum):
    PENDING = "pending"
    DRAINING = "draining"
    LOADING = "loading"
    RESTORING = "restoring"
    RESUMING = "resuming"
    REJOINING = "rejoining"
    DONE = "done"
    FAILED = "failed"


STEPS = table(
    [
        (RolloutStep.PENDING, [RolloutStep.DRAINING]),
        (RolloutStep.DRAINING, [RolloutStep.LOADING, RolloutStep.RESUMING]),
        (RolloutStep.LOADING, [RolloutStep.RESTORING, RolloutStep.RESUMING]),
        (RolloutStep.RESTORING, [RolloutStep.RESUMING]),
        (RolloutStep.RESUMING, [RolloutStep.REJOINING, RolloutStep.FAILED]),
        (RolloutStep.REJOINING, [RolloutStep.DONE, RolloutStep.FAILED]),
    ]
)

# Waits until traffic reaches the board again; returns what it saw. Raises CalculetError when not.
Rejoin = Callable[[DaemonClient], str]


class BoardRollout:
    """Roll one board (see the module docstring).

    Args:
        plan: the board, with the package the alias serves now.
        alias / package: what to load (package relative to the daemon's models root).
        access: TLS and token (the operate plane's token).
        window_ms: drain window, also the Load's drain timeout for the old generation.
        interrupt: at the end of the window, end the jobs still running instead of stopping.
        rejoin: the wait after Resume.
        say: prints one line about this board.
    """

    def __init__(
        self,
        plan: BoardPlan,
        *,
        alias: str,
        package: str,
        access: DaemonAccess,
        window_ms: int,
        interrupt: bool,
        rejoin: Rejoin,
        say: Callable[[str], None],
    ) -> None:
        self.plan = plan
        self.alias, self.package = alias, package
        self._access, self._window_ms, self._interrupt = access, window_ms, interrupt
        self._rejoin, self._say = rejoin, say
        self.life = Lifecycle(f"rollout of {plan.label}", RolloutStep.PENDING, STEPS)
        self._failures: list[str] = []

    @property
    def failure(self) -> str | None:
        return "; ".join(self._failures) if self._failures else None

    def run(self) -> str | None:
        """Roll the board. Returns None on success, else why the rollout stops here."""
        with self._access.client(self.plan.target) as client:
            serves = True  # the alias still serves, old package or new
            try:
                self._drain(client)
                if not self._failures:
                    self._load(client)
            except CalculetError as err:
                self._fail(f"{self.life.state.value}: {err.kind.value}: {err}")
                serves = False
            if self._resume(client) and serves:
                self._wait_rejoined(client)
        self.life.move(RolloutStep.FAILED if self._failures else RolloutStep.DONE)
        return self.failure

    def _drain(self, client: DaemonClient) -> None:
        self.life.move(RolloutStep.DRAINING)
        resp = client.drain(timeout_ms=self._window_ms, interrupt_remaining=self._interrupt)
        if not resp.drained:
            self._fail(
                f"drain: {resp.remaining_jobs} job(s) still running after {self._window_ms / 1000:g} s "
                "(a longer --drain-timeout, or --interrupt to end them resumable elsewhere)"
            )
            return
        ended = f", {resp.interrupted_jobs} job(s) ended to resume elsewhere" if resp.interrupted_jobs else ""
        self._say(f"drained{ended}")

    def _load(self, client: DaemonClient) -> None:
        self.life.move(RolloutStep.LOADING)
        try:
            final = client.load_and_wait(self.alias, self.package, replace=True, drain_timeout_ms=self._window_ms)
        except CalculetError as err:
            self._fail(f"load of {self.package} failed: {err.kind.value}: {err}")
            self._say(f"load of {self.package} FAILED: {err}")
            self._keep_serving(client)
            return
        self._say(f"loaded {self.package}: generation {final.generation} READY (golden check passed)")

    def _keep_serving(self, client: DaemonClient) -> None:
        """After a failed load: the old generation still serves, or load the old package again."""
        ready = common_pb2.MODEL_STATE_READY
        serving = next((m for m in client.status().models if m.alias == self.alias and m.state == ready), None)
        if serving is not None:
            self._say(f"generation {serving.generation} ({serving.package_path}) still serves {self.alias}")
            return
        self.life.move(RolloutStep.RESTORING)
        old = self.plan.old_package
        final = client.load_and_wait(self.alias, old, replace=True, drain_timeout_ms=self._window_ms)
        self._say(f"restored {old} (the package before the rollout): generation {final.generation} READY")

    def _resume(self, client: DaemonClient) -> bool:
        """Resume the board; whether it worked."""
        self.life.move(RolloutStep.RESUMING)
        try:
            client.resume()
        except CalculetError as err:
            self._fail(f"resume failed ({err.kind.value}: {err}): run `calctl resume --daemon {self.plan.target}`")
            return False
        self._say("resumed: admitting again")
        return True

    def _wait_rejoined(self, client: DaemonClient) -> None:
        self.life.move(RolloutStep.REJOINING)
        try:
            self._say(self._rejoin(client))
        except CalculetError as err:
            self._fail(f"not serving again: {err.kind.value}: {err}")

    def _fail(self, text: str) -> None:
        self._failures.append(text)
