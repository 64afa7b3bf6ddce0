"""An operator reset from request to answer (the Reset RPC, `DeviceCore.operator_reset`): check the
request, take the reset controller's gate, reset the device, lift a halt, warm again the models a
configuration reset dropped, wait for the jobs it hit to settle, give the gate back, audit.

The state of every step is the `ResetController`'s (`controller.py`), whose methods run each
step under the engine lock or call the device outside it; this module orders them:

    begin_operator_reset        IDLE -> OPERATOR_CCU | OPERATOR_CONFIGURATION (or FAILED_PRECONDITION)
    reset_ccu | reset_configuration
    hooks.memory_back           device memory re-measured against its baseline
    keeps_halt | operator_reset_succeeded, hooks.rewarm
    wait_settled                -> SETTLING, until the jobs it hit rebuilt their KV or ended
    note_outcome, end           -> IDLE
    record                      the audit entry, with the board's health before and after

What it needs from outside the engine (the model manager, the board's health) comes in
`OperatorHooks`, which `DeviceCore` supplies.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from calculet.common.errors import CalculetError, FailedPrecondition, InvalidArgument, NotFound
from calculet.daemon.core.audit import AuditEntry, AuditPoint, entry_around
from calculet.daemon.core.errors import MemoryNotBack
from calculet.daemon.core.resets.budget import SETTLE_TIMEOUT_S, ResetReport, ResetTally
from calculet.daemon.core.resets.controller import ResetController
from calculet.daemon.core.runtime import ModelRuntime
from calculet.daemon.device.errors import DeviceError


@dataclass(frozen=True)
class OperatorHooks:
    """What an operator reset needs from outside the engine; `DeviceCore` supplies it.

    Attributes:
        loaded: whether a model alias is loaded (a configuration reset may name one).
        rewarm: configure and warm again a generation a configuration reset dropped
            (`ModelManager.rewarm`); returns why it failed (it is Failed and unloaded then), or None.
        audit_point: (serving, "alias@generation" of every serving model), from the board's health,
            recorded before and after the reset.
        memory_back: `memory_back(configuration)` after the device reset (`configuration`: it
            dropped every configuration): re-measure the device's memory against its baseline
            (`ModelManager.memory_back`); returns what it holds above it, or None when it is back.
    """

    loaded: Callable[[str], bool]
    rewarm: Callable[[ModelRuntime], CalculetError | None]
    audit_point: Callable[[], tuple[bool, tuple[str, ...]]]
    memory_back: Callable[[bool], str | None]


def operator_reset(
    resets: ResetController,
    hooks: OperatorHooks,
    kind: str,
    reason: str,
    model: str = "",
    settle_timeout_s: float | None = None,
) -> ResetReport:
    """Operator reset, one at a time. kind: "ccu" (in-flight jobs end as CCU exceptions; their
    sequences re-prefill) or "configuration" (as on CalRT 0.7.6 every configured model is dropped,
    whichever `model` names; each Ready one is configured again and passes its golden check, then
    its jobs re-prefill and continue). Neither is a device anomaly. Either re-measures the device's
    memory against its baseline: while it is not back the report is not ok (`MemoryNotBack`) and a
    halt stays. A successful one lifts a halt (a used-up automatic reset budget, an unload that did
    not give its memory back), clears the budget and restores the in-flight limit.

    Steps: OPERATOR_CCU or OPERATOR_CONFIGURATION (`begin_operator_reset`, the device call,
    `operator_reset_succeeded`, the models warmed again), SETTLING (`wait_settled`), IDLE
    (`end`); then the audit entry.

    Args:
        settle_timeout_s: how long to wait for the jobs it hit to rebuild their KV or end before
            counting them (None: `SETTLE_TIMEOUT_S`). The reset is in progress until then.

    Returns:
        The report: ok, or not with the error (the device failed the reset, its memory is not back
        at its baseline, or the board still cannot serve); the jobs it hit and their fate.

    Raises:
        InvalidArgument: unknown kind, or a model named for a CCU reset.
        NotFound: `model` is not loaded.
        FailedPrecondition: another reset is in progress (nothing was done).
    """
    if kind not in ("ccu", "configuration"):
        raise InvalidArgument(f"reset kind must be ccu or configuration, got {kind!r}")
    if model and kind != "configuration":
        raise InvalidArgument("model: only a configuration reset can be limited to one model")
    if model and not hooks.loaded(model):
        raise NotFound(f"model {model!r} is not loaded")
    tally = resets.begin_operator_reset(kind, reason)
    before = hooks.audit_point()
    settle = SETTLE_TIMEOUT_S if settle_timeout_s is None else settle_timeout_s
    report = reset_and_settle(resets, hooks, kind, tally, settle, lift_halt=True)
    resets.record(reset_entry(report, reason, before, hooks.audit_point()))
    return report


def reset_and_settle(
    resets: ResetController, hooks: OperatorHooks, kind: str, tally: ResetTally, settle_s: float, *, lift_halt: bool
) -> ResetReport:
    """A reset whose gate is taken, from the device call to the gate given back: reset the device,
    re-measure its memory, warm the dropped models again, wait up to `settle_s` for the jobs it hit,
    note the outcome, end (an operator reset's steps, and an escalation's, `automatic.py`).
    `lift_halt`: an operator's reset lifts a halt first, so the warm-up probes can run, but only once
    the memory is back; and it reports memory that is not back as its outcome. An escalation's
    reset runs only on a board that is not halted, and a memory warning is not its outcome."""
    try:
        problem: CalculetError | None
        try:
            message, dropped = reset_device(resets, kind)
            memory = memory_not_back(hooks, kind)
            kept = resets.keeps_halt(memory) if lift_halt else None
            lifted = kept or (resets.operator_reset_succeeded() if lift_halt else None)
            # Still halted for its memory, a dropped model is not configured again: it fails (its
            # jobs end UNAVAILABLE) rather than wait in Configuring with a handle the reset voided.
            warmed = rewarm_all(hooks, dropped) if lifted is None or lifted is kept else None
            problem = lifted or warmed or (memory if lift_halt else None)
        except DeviceError as exc:  # attempted, and the device failed it: the outcome is the answer
            message, problem = f"{kind} reset failed", exc
        counts = resets.wait_settled(tally, settle_s if problem is None else 0.0)
        resets.note_outcome(kind, problem is None)
    finally:
        resets.end()
    if problem is not None:
        return ResetReport(kind, False, f"{message}: {problem}", counts, problem)
    return ResetReport(kind, True, message, counts)


def reset_device(resets: ResetController, kind: str) -> tuple[str, list[ModelRuntime]]:
    """The device part of an operator reset. Returns what was done, and the generations a
    configuration reset dropped (to configure and warm again once the board may serve).

    Raises:
        DeviceError: the device failed the reset.
    """
    if kind == "ccu":
        resets.reset_ccu()
        return "compute units reset", []
    dropped = resets.reset_configuration("configuration reset")
    names = ", ".join(f"{rt.alias} (generation {rt.generation})" for rt in dropped) or "none"
    return f"configuration reset: {names} configured and warmed again; their jobs re-prefill", dropped


def memory_not_back(hooks: OperatorHooks, kind: str) -> MemoryNotBack | None:
    """After the device reset: re-measure its memory against its baseline. Returns why it is not
    back, with what would bring it back, or None."""
    held = hooks.memory_back(kind == "configuration")
    if held is None:
        return None
    if kind == "ccu":
        advice = "a CCU reset frees no memory: reset the configuration with a model loaded, or restart the daemon"
    else:
        advice = "restart the daemon (a configuration reset frees memory only through a configured model)"
    return MemoryNotBack(f"device memory is not back: {held}; {advice}")


def rewarm_all(hooks: OperatorHooks, dropped: list[ModelRuntime]) -> CalculetError | None:
    """Configure and warm again every generation a configuration reset dropped. Returns why one
    failed (it is Failed and unloaded then), or None."""
    failed = [(rt, err) for rt in dropped if (err := hooks.rewarm(rt)) is not None]
    if not failed:
        return None
    rt, err = failed[0]
    return FailedPrecondition(f"model {rt.alias} failed its warm-up after the configuration reset: {err}")


def reset_entry(
    report: ResetReport,
    reason: str,
    before: AuditPoint,
    after: AuditPoint,
    fault: str = "operator",
) -> AuditEntry:
    """The audit entry of an operator reset (`fault` "operator") or an escalation's (the fault that
    escalated)."""
    c = report.counts
    return entry_around(
        before, after, kind=report.kind, automatic=fault != "operator", reason=reason, fault=fault,
        inflight_jobs=c.inflight, recovered=c.recovered, failed=c.failed, ok=report.ok, message=report.message,
    )  # fmt: skip
