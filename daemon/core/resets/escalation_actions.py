"""`BoardEscalations`: what each escalation does on one board (`escalations.py` says when and why).

It acts through the engine's reset controller, the model manager and the operator-reset hooks, and
records every escalation in the board's audit trail (`core/audit.py`) with its reason, the jobs it hit, the serving
models and health before and after, and its result.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from calculet.common.errors import CalculetError
from calculet.daemon.core.audit import AuditPoint, BoardAudit, escalation_entry
from calculet.daemon.core.engine import Engine
from calculet.daemon.core.golden import GoldenVerdict
from calculet.daemon.core.models import ModelManager
from calculet.daemon.core.resets.automatic import automatic_reset
from calculet.daemon.core.resets.escalation_watch import Escalation, EscalationKind
from calculet.daemon.core.resets.escalations import EXIT_DEVICE_UNHEALTHY, EscalationActions
from calculet.daemon.core.resets.operator import OperatorHooks, memory_not_back, rewarm_all
from calculet.daemon.device.api import VirtualDevice
from calculet.daemon.device.errors import DeviceError

log = logging.getLogger(__name__)

FAULT_CCU = "ccu exceptions"
FAULT_NON_FINITE = "non-finite logits"
FAULT_UNHEALTHY = "device unhealthy"


class BoardEscalations(EscalationActions):
    """The escalations of one board.

    Args:
        engine: the board's engine (its reset controller, its job counts).
        models: the model manager (golden re-checks, rollbacks).
        device: the board (asked whether it answers after a reset).
        hooks: what resets need beyond the engine (re-warm, health for the audit).
        exit_process: asks the daemon to stop and exit with `EXIT_DEVICE_UNHEALTHY`; None: the board
            stays up, NOT_SERVING (`--unhealthy-exit off`).
        audit: the board's audit trail, where each escalation is recorded.
    """

    def __init__(
        self,
        engine: Engine,
        models: ModelManager,
        device: VirtualDevice,
        hooks: OperatorHooks,
        exit_process: Callable[[str], None] | None,
        audit: BoardAudit,
    ) -> None:
        self._engine = engine
        self._audit = audit
        self._models = models
        self._device = device
        self._hooks = hooks
        self._exit_process = exit_process

    def act(self, escalation: Escalation) -> None:
        if escalation.kind is EscalationKind.CCU:
            automatic_reset(self._engine.resets, self._hooks, escalation.reset_kind, escalation.reason, FAULT_CCU)
        elif escalation.kind is EscalationKind.QUARANTINE:
            self._quarantine(escalation)
        else:
            self._unhealthy(escalation)

    def _quarantine(self, escalation: Escalation) -> None:
        rt = next((r for r in self._models.all() if r.generation == escalation.generation), None)
        if rt is None:
            return
        before = self._hooks.audit_point()
        jobs = self._engine.generations.count_sequences(rt.generation)
        log.error("model %s generation %d: %s: quarantined", rt.alias, rt.generation, escalation.reason)
        outcome = self._models.recheck(rt, escalation.reason)
        if outcome is None:  # no longer Ready (unloaded, replaced or reset meanwhile)
            return
        failed = outcome.verdict is GoldenVerdict.FAILED
        (log.error if failed else log.warning)("model %s: %s", rt.alias, outcome.message)
        self._record("quarantine", escalation.reason, FAULT_NON_FINITE, jobs, before, outcome.serving, outcome.message)

    def _unhealthy(self, escalation: Escalation) -> None:
        """Reset a lost board's device; lift the halt and warm its models again if it answers after
        with its memory back at its baseline, else ask for a process restart."""
        if self._engine.crashed:
            self._restart(escalation.reason, "a device thread crashed; only a restart brings it back")
            return
        resets = self._engine.resets
        before = self._hooks.audit_point()
        if resets.begin_automatic_reset("configuration", escalation.reason, FAULT_UNHEALTHY, lost=True) is None:
            self._restart(escalation.reason, "no automatic reset allowed (budget used up or a reset in progress)")
            return
        problem: CalculetError | None
        try:
            try:
                dropped = resets.reset_configuration(escalation.reason)
                self._device.counters()  # does the device answer again?
            except DeviceError as exc:
                problem = exc
            else:
                # A halt lifts only with the memory back (docs/daemon.md, "Device memory").
                problem = memory_not_back(self._hooks, "configuration")
                if problem is None:
                    resets.lift_lost()
                    problem = rewarm_all(self._hooks, dropped)
            resets.note_outcome("configuration", problem is None)
        finally:
            resets.end()
        message = (
            "device reset, models warmed again" if problem is None else f"device reset did not restore it: {problem}"
        )
        self._record("configuration", escalation.reason, FAULT_UNHEALTHY, 0, before, problem is None, message)
        if problem is not None:
            self._restart(escalation.reason, message)

    def _restart(self, reason: str, why: str) -> None:
        if self._exit_process is None:
            message = f"{why}; stays NOT_SERVING (--unhealthy-exit off): restart it"
        else:
            message = f"{why}; exiting with status {EXIT_DEVICE_UNHEALTHY} for the supervisor to restart the daemon"
        log.error("%s: %s", reason, message)
        self._record("restart", reason, FAULT_UNHEALTHY, 0, self._hooks.audit_point(), False, message)
        if self._exit_process is not None:
            self._exit_process(f"{reason}: {why}")

    def _record(
        self, kind: str, reason: str, fault: str, jobs: int, before: AuditPoint, ok: bool, message: str
    ) -> None:
        after = self._hooks.audit_point()
        self._audit.record(escalation_entry(kind, reason, fault, jobs, before, after, ok, message))
