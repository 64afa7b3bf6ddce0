"""The reset controller's bookkeeping (docs/daemon.md, reset controller; docs/sources.md 000 §14).

- `ResetBudget`: automatic resets (a hung job) are allowed `limit` times per `window_s`; past that
  the board stops resetting itself, reports NOT_SERVING and waits for an operator, so a broken
  board cannot reset in a storm. Operator resets (the Reset RPC) are not limited, and a successful
  one clears the budget (observe.proto ResetBudget).
- `BoardHalt`: why the board stopped serving on its own. AWAITING_OPERATOR (the budget was used up,
  or an unload did not give its memory back) is lifted by a successful operator reset that finds the
  device's memory back at its baseline; a halted board configures no package meanwhile. LOST (a
  lost device, a job hung after a reset, a crashed device thread) by the unhealthy escalation's
  device reset when it restores the board (its memory back too), else by the process restart that
  escalation asks its supervisor for (`escalations.py`).
- `ResetState` and `ResetGate`: which reset runs, one at a time (the `ResetController`'s reset
  lifecycle). A Reset while another (operator or automatic) is in progress is refused with
  FAILED_PRECONDITION (operate.proto); an automatic reset never waits for the gate.
- `ResetTally`: the client jobs one reset hit and what became of them (ResetResult.inflight_jobs,
  recovered_jobs, failed_jobs), and `ResetReport`, the outcome an operator reset returns.

Ownership: the `ResetController` (`controller.py`) owns one of each; callers hold the engine lock
for every method here.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import Enum, auto

from calculet.common.errors import CalculetError, InvalidArgument
from calculet.common.lifecycle import Lifecycle, table
from calculet.daemon.core.client_job import ClientJob, SeqState
from calculet.daemon.core.events import FinalEvent, FinishReason

SETTLE_TIMEOUT_S = 10.0  # how long an operator reset waits for the jobs it hit before it answers


@dataclass(frozen=True)
class BudgetView:
    used: int
    limit: int
    window_s: float
    exhausted: bool


class ResetBudget:
    """At most `limit` automatic resets in any `window_s` seconds.

    Raises (on construction):
        InvalidArgument: limit < 0 or window_s <= 0.
    """

    def __init__(self, limit: int = 3, window_s: float = 600.0, clock: Callable[[], float] = time.monotonic):
        if limit < 0 or window_s <= 0:
            raise InvalidArgument(f"reset budget: limit >= 0 and window > 0 required, got {limit}/{window_s}")
        self.limit = limit
        self.window_s = window_s
        self._clock = clock
        self._times: deque[float] = deque()
        self.exhausted = False

    def try_spend(self) -> bool:
        """Record one automatic reset if the budget allows it; otherwise mark it exhausted."""
        self._forget_old()
        if len(self._times) >= self.limit:
            self.exhausted = True
            return False
        self._times.append(self._clock())
        return True

    def clear(self) -> None:
        """A successful operator reset: forget every automatic reset and the exhausted mark."""
        self._times.clear()
        self.exhausted = False

    def view(self) -> BudgetView:
        self._forget_old()
        return BudgetView(len(self._times), self.limit, self.window_s, self.exhausted)

    def _forget_old(self) -> None:
        horizon = self._clock() - self.window_s
        while self._times and self._times[0] <= horizon:
            self._times.popleft()


class BoardHalt(Enum):
    """Why the board stopped serving on its own (`ResetController.halted` in both halts; the
    snapshot's `device_lost`)."""

    NONE = auto()  # not halted
    AWAITING_OPERATOR = auto()  # budget used up, or an unload leaked: an operator reset with the memory back lifts it
    LOST = auto()  # device lost, unrecoverable after a reset, or a device thread crashed: a device reset or a restart


# LOST -> NONE only when the unhealthy escalation's device reset restored the board (`escalations.py`).
HALT_TRANSITIONS = table(
    [
        (BoardHalt.NONE, [BoardHalt.AWAITING_OPERATOR, BoardHalt.LOST]),
        (BoardHalt.AWAITING_OPERATOR, [BoardHalt.NONE, BoardHalt.LOST]),
        (BoardHalt.LOST, [BoardHalt.NONE]),
    ]
)


class ResetState(Enum):
    """Which reset the board runs; one at a time (`RESET_TRANSITIONS`)."""

    IDLE = auto()
    AUTOMATIC_CCU = auto()  # a hung device job, or a CCU escalation: the compute units are reset
    AUTOMATIC_CONFIGURATION = auto()  # CCU exceptions that recur after a CCU reset: reset, models warmed again
    OPERATOR_CCU = auto()  # the Reset RPC (ccu): the compute units are reset, a halt for the budget lifted
    OPERATOR_CONFIGURATION = auto()  # the Reset RPC (configuration): reset, a halt lifted, models warmed again
    SETTLING = auto()  # a reset waits for the jobs it hit to rebuild their KV or end, then is audited


# The reset after a hung job ends without settling (its jobs recover on their own, nobody waits for
# an answer); an operator reset or an escalation's settles, or goes back to IDLE at once when an
# unexpected error ends it first.
RESET_TRANSITIONS = table(
    [
        (
            ResetState.IDLE,
            [
                ResetState.AUTOMATIC_CCU,
                ResetState.AUTOMATIC_CONFIGURATION,
                ResetState.OPERATOR_CCU,
                ResetState.OPERATOR_CONFIGURATION,
            ],
        ),
        (ResetState.AUTOMATIC_CCU, [ResetState.SETTLING, ResetState.IDLE]),
        (ResetState.AUTOMATIC_CONFIGURATION, [ResetState.SETTLING, ResetState.IDLE]),
        (ResetState.OPERATOR_CCU, [ResetState.SETTLING, ResetState.IDLE]),
        (ResetState.OPERATOR_CONFIGURATION, [ResetState.SETTLING, ResetState.IDLE]),
        (ResetState.SETTLING, [ResetState.IDLE]),
    ]
)


class ResetGate:
    """One reset at a time: the running reset's state, `holder` (which reset runs, for the refusal
    message) and `tally` (where resets record the client jobs they hit). `Lifecycle.move` is the one
    transition function; an edge missing from `RESET_TRANSITIONS` raises `IllegalTransition`."""

    def __init__(self) -> None:
        self._life: Lifecycle[ResetState] = Lifecycle("reset controller", ResetState.IDLE, RESET_TRANSITIONS)
        self.holder = ""
        self.tally: ResetTally | None = None  # the running operator reset's, where resets record hits

    @property
    def state(self) -> ResetState:
        return self._life.state

    @property
    def busy(self) -> bool:
        return self._life.state is not ResetState.IDLE

    def try_begin(
        self, holder: str, tally: ResetTally | None = None, state: ResetState = ResetState.AUTOMATIC_CCU
    ) -> bool:
        """Take the gate for a reset of kind `state` (AUTOMATIC_CCU unless said; an operator reset
        passes its tally). Returns False, changing nothing, when another reset holds it.

        Raises:
            IllegalTransition: `state` is not a reset's first state (IDLE, SETTLING).
        """
        if self.busy:
            return False
        self._life.move(state)
        self.holder, self.tally = holder, tally
        return True

    def settle(self) -> None:
        """The operator reset's device work is done: it waits for the jobs it hit (`holder` and
        `tally` stay).

        Raises:
            IllegalTransition: no operator reset holds the gate.
        """
        self._life.move(ResetState.SETTLING)

    def end(self) -> None:
        """Give the gate back.

        Raises:
            IllegalTransition: no reset holds it.
        """
        self._life.move(ResetState.IDLE)
        self.holder, self.tally = "", None


@dataclass(frozen=True)
class ResetCounts:
    """ResetResult's job counts. `inflight` = client jobs the reset hit; of those `recovered` rebuilt
    their KV and continue (or finished since), `failed` ended with an error; the rest were still
    re-prefilling when the counts were taken, or were cancelled."""

    inflight: int = 0
    recovered: int = 0
    failed: int = 0


class JobFate(Enum):
    PENDING = auto()  # its faulted job is not applied yet, or it is re-prefilling
    RECOVERED = auto()
    FAILED = auto()
    NEITHER = auto()  # cancelled, or finished normally before the reset reached it


@dataclass
class ResetTally:
    """The client jobs (sequences) one reset hit, with their recovery count when it hit them."""

    hit: dict[str, tuple[ClientJob, int]] = field(default_factory=dict)

    def add(self, seqs: Iterable[ClientJob]) -> None:
        """Record sequences the reset hit, before their recovery starts (first record wins)."""
        for seq in seqs:
            if not seq.internal:  # warm-up probes are not client jobs
                self.hit.setdefault(seq.job_id, (seq, seq.recoveries))

    def settled(self) -> bool:
        return all(fate(seq, before) is not JobFate.PENDING for seq, before in self.hit.values())

    def counts(self) -> ResetCounts:
        fates = [fate(seq, before) for seq, before in self.hit.values()]
        return ResetCounts(len(fates), fates.count(JobFate.RECOVERED), fates.count(JobFate.FAILED))


def fate(seq: ClientJob, recoveries_before: int) -> JobFate:
    """What became of a sequence a reset hit when it had `recoveries_before` recoveries."""
    recovered = seq.recoveries > recoveries_before
    if seq.state is SeqState.DONE:
        final = seq.log.read(0)[-1]
        assert isinstance(final, FinalEvent)
        if final.reason is FinishReason.CANCELLED:
            return JobFate.NEITHER
        if final.error_kind is not None:
            return JobFate.FAILED
        return JobFate.RECOVERED if recovered else JobFate.NEITHER
    if recovered and seq.state in (SeqState.READY, SeqState.DECODE):
        return JobFate.RECOVERED  # re-prefilled: its KV is rebuilt
    return JobFate.PENDING


@dataclass(frozen=True)
class ResetReport:
    """The outcome of one operator reset (the core's side of ResetResult).

    Attributes:
        kind: "ccu" or "configuration".
        ok: the device reset succeeded and the board is no longer halted by it.
        message: what happened, for the log.
        counts: the client jobs it hit and their fate.
        error: with ok False, why (the device failed the reset, or a job is still hung on it).
    """

    kind: str
    ok: bool
    message: str
    counts: ResetCounts = ResetCounts()
    error: CalculetError | None = None
