"""An escalation's reset from decision to audit (docs/sources.md 000 §14): repeated CCU exceptions reset
the compute units, and if they recur, the configuration, whose models are then warmed again.

Like an operator reset (`operator.py`) but started by the board itself: it spends the automatic
reset budget (past it the board halts and waits for an operator), never lifts a halt nor clears the
budget, and its audit entry is `automatic` with the fault that escalated. The steps, whose state is
the `ResetController`'s:

    begin_automatic_reset    IDLE -> AUTOMATIC_CCU | AUTOMATIC_CONFIGURATION (or not at all)
    reset_ccu | reset_configuration, hooks.rewarm
    wait_settled             -> SETTLING, until the jobs it hit rebuilt their KV or ended
    note_outcome, end        -> IDLE
    record                   the audit entry, with the board's health before and after

The jobs it hits re-prefill and continue exactly, as after an operator's reset.
"""

from __future__ import annotations

import logging

from calculet.daemon.core.resets.budget import SETTLE_TIMEOUT_S, ResetReport
from calculet.daemon.core.resets.controller import ResetController
from calculet.daemon.core.resets.operator import OperatorHooks, reset_and_settle, reset_entry

log = logging.getLogger(__name__)


def automatic_reset(
    resets: ResetController,
    hooks: OperatorHooks,
    kind: str,
    reason: str,
    fault: str,
    settle_timeout_s: float = SETTLE_TIMEOUT_S,
) -> ResetReport | None:
    """Reset the board for an escalation. kind: "ccu" or "configuration".

    Args:
        reason: why (the audit entry's reason).
        fault: the fault that escalated (the audit entry's fault).
        settle_timeout_s: how long to wait for the jobs it hit before counting them.

    Returns:
        The report; None when no reset ran (`ResetController.begin_automatic_reset` says why and
        audits a used-up budget).
    """
    tally = resets.begin_automatic_reset(kind, reason, fault)
    if tally is None:
        return None
    before = hooks.audit_point()
    log.error("%s: automatic %s reset", reason, kind)
    report = reset_and_settle(resets, hooks, kind, tally, settle_timeout_s, lift_halt=False)
    resets.record(reset_entry(report, reason, before, hooks.audit_point(), fault=fault))
    return report
