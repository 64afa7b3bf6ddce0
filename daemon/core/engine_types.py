"""What crosses the engine's boundary: its settings (`EngineConfig`, built from the daemon's
configuration in `config.py` and read by the engine and its reset controller; frozen: a reload
changes the reset budget through `ResetController.set_budget`) and the answers of its methods
(`SubmitReceipt`, `ProbeOutcome`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from calculet.daemon.core.events import FinalEvent
from calculet.daemon.core.executor import RESTORE_AFTER_CLEAN_JOBS
from calculet.daemon.core.resets.escalation_watch import CCU_ESCALATION, ESCALATION_WINDOW_S, NAN_ESCALATION
from calculet.daemon.core.resets.submit_streak import SUBMIT_ERROR_STREAK
from calculet.daemon.core.scheduler import SchedulingPolicy


@dataclass(frozen=True)
class EngineConfig:
    """Engine settings.

    Attributes:
        policy: scheduling knobs.
        max_inflight: device jobs in flight at once (capped by the device's capability).
        synchronous: wait for each device job right after submitting it (the serial policy).
        launch_from_completion: the completion thread plans and submits the next device job itself
            once it has applied one, on its core that is awake, instead of waking the engine thread
            for it (a sleeping core runs the same code several times slower; `engine.py`).
        job_timeout_s: wall-clock wait for one device job before the device is reset.
        max_recoveries: re-prefills a sequence may need after lost KV before it fails.
        reset_limit / reset_window_s: automatic resets allowed per window before the board stops
            serving and waits for an operator.
        restore_after_clean_jobs: consecutive clean completions after which an in-flight limit
            degraded by an anomaly comes back (0 = only a successful operator reset restores it).
        orphan_timeout_s: a job with no Wait stream attached for this long is cancelled, so a client
            that submits and disappears cannot hold a lane forever (None = never).
        retention_bytes / retention_s: finished jobs are kept for re-attaching `Wait` calls and
            idempotent Submit retries while their estimated bytes (`events.job_bytes`) fit and for
            at most this many seconds after their Final; the oldest go first.
        submit_error_streak: consecutive submit errors that drain the board (0 = never;
            `resets/submit_streak.py`).
        ccu_escalation / nan_escalation / escalation_window_s: CCU exceptions, and non-finite outputs
            of one generation, within the window that escalate (0 = never; `resets/escalation_watch.py`).
    """

    policy: SchedulingPolicy = field(default_factory=SchedulingPolicy)
    max_inflight: int = 2
    synchronous: bool = False
    launch_from_completion: bool = True
    job_timeout_s: float = 30.0
    max_recoveries: int = 3
    retention_bytes: int = 256 * 1024 * 1024
    retention_s: float = 600.0
    reset_limit: int = 3
    reset_window_s: float = 600.0
    restore_after_clean_jobs: int = RESTORE_AFTER_CLEAN_JOBS
    orphan_timeout_s: float | None = 60.0
    submit_error_streak: int = SUBMIT_ERROR_STREAK
    ccu_escalation: int = CCU_ESCALATION
    nan_escalation: int = NAN_ESCALATION
    escalation_window_s: float = ESCALATION_WINDOW_S


@dataclass(frozen=True)
class SubmitReceipt:
    """What Submit answers: the job's id, whether an earlier identical Submit already started it, its
    seed and the model generation it runs on."""

    job_id: str
    deduplicated: bool
    seed: int
    generation: int


@dataclass(frozen=True)
class ProbeOutcome:
    """A finished warm-up probe: its Final, its tokens, its first step's logits, how many times it
    re-prefilled after lost KV (a device fault during the check), how many of those were for
    non-finite logits, and the KV tokens of a parked lane it took (the offset check's continued run)."""

    final: FinalEvent
    tokens: tuple[int, ...]
    first_logits: np.ndarray | None
    recoveries: int = 0
    nonfinite: int = 0
    cached_tokens: int = 0
