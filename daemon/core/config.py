"""`DaemonConfig`: everything a daemon is started with (flags and config file, already merged), and
the engine settings it implies."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from calculet.common.errors import InvalidArgument
from calculet.daemon.core.chunking import CHUNK_AUTO, CHUNK_OFF
from calculet.daemon.core.engine_types import EngineConfig
from calculet.daemon.core.executor import RESTORE_AFTER_CLEAN_JOBS
from calculet.daemon.core.resets.escalation_watch import CCU_ESCALATION, ESCALATION_WINDOW_S, NAN_ESCALATION
from calculet.daemon.core.resets.submit_streak import SUBMIT_ERROR_STREAK
from calculet.daemon.core.scheduler import DECODE_JOBS_AUTO, SchedulingPolicy

POLICIES = ("continuous", "serial")


@dataclass(frozen=True)
class DaemonConfig:
    """Everything the daemon is started with (flags and config file, already merged).

    Attributes:
        board: board index on this host.
        device: driver name in the `calculet.devices` entry point group.
        device_options: driver options (calsim: time_scale, fault_plan, ...).
        models_root: package paths given to Load must resolve inside it.
        models: startup models as (alias, path relative to models_root or absolute inside it).
        policy: "continuous" (batching, ping/pong) or "serial" (one device job at a time, the baseline
            for comparison).
        max_inflight: 1 or 2 (capped by the device's capability).
        job_timeout_s: wall-clock wait for one device job before the device is reset.
        fault_injection: allow the InjectFault RPC (calsim only).
        drain_timeout_s: default drain/unload timeout.
        min_residency_s: a generation Ready for less than this is not switched away unless forced.
        orphan_timeout_s: cancel a job that has had no Wait stream for this long (None = never).
        retention_bytes: estimated bytes of finished jobs kept for Wait re-attach and Submit retries
            (oldest evicted first; 0 keeps none).
        retention_s: seconds a finished job is kept at most after its Final.
        reset_limit / reset_window_s: automatic resets allowed per window before the board waits
            for an operator.
        submit_error_streak: consecutive submit errors that drain the board (0 = never).
        ccu_escalation / nan_escalation / escalation_window_s: CCU exceptions, and non-finite outputs
            of one generation, within the window that reset the CCU (a configuration reset when they
            repeat) or quarantine the generation (0 = never).
        audit_journal: the file that keeps the board's audit trail (`core/audit.py`) across restarts (None: in memory;
            the daemon uses `<runtime dir>/board<N>-resets.jsonl`).
        unhealthy_exit: when the device is lost or a reset cannot restore it, end the process with
            `EXIT_DEVICE_UNHEALTHY` so its supervisor restarts it (False: stay up, NOT_SERVING).
        restore_after_clean_jobs: clean completions that restore a degraded in-flight limit (0 =
            only an operator reset does).
        max_recoveries: re-prefills one job may need after lost KV before it fails.
        prefix_reuse / prefix_min_tokens: park finished jobs' lanes and match new jobs against them
            (the shortest shared prefix worth a parked lane), where the package's prefill is proven
            to run at an offset (`prefill_offset.py`).
        prefill_chunk: `chunking.CHUNK_AUTO`, `CHUNK_OFF` or tokens per prefill job (the serial
            policy, today's path, never chunks), where the prefill is proven to run at an offset.
        prefix_reuse_forced / prefill_chunk_forced: the operator set them on explicitly: a package
            whose prefill is not proven to run at an offset fails to load instead of serving without.
    """

    board: int = 0
    device: str = "calsim"
    device_options: dict[str, Any] = field(default_factory=dict)
    models_root: Path = Path(".")
    models: tuple[tuple[str, str], ...] = ()
    policy: str = "continuous"
    max_inflight: int = 2
    job_timeout_s: float = 30.0
    fault_injection: bool = False
    drain_timeout_s: float = 30.0
    min_residency_s: float = 0.0
    queue_depth: int = 1024
    admission_timeout_s: float = 30.0
    decode_jobs_per_model: int = DECODE_JOBS_AUTO
    orphan_timeout_s: float | None = 60.0
    retention_bytes: int = 256 * 1024 * 1024
    retention_s: float = 600.0
    reset_limit: int = 3
    reset_window_s: float = 600.0
    submit_error_streak: int = SUBMIT_ERROR_STREAK
    ccu_escalation: int = CCU_ESCALATION
    nan_escalation: int = NAN_ESCALATION
    escalation_window_s: float = ESCALATION_WINDOW_S
    unhealthy_exit: bool = True
    audit_journal: Path | None = None
    restore_after_clean_jobs: int = RESTORE_AFTER_CLEAN_JOBS
    max_recoveries: int = 3
    prefix_reuse: bool = True
    prefix_min_tokens: int = 16
    prefill_chunk: int = CHUNK_AUTO
    prefix_reuse_forced: bool = False
    prefill_chunk_forced: bool = False

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise InvalidArgument(f"policy: must be one of {', '.join(POLICIES)}, got {self.policy!r}")
        if self.max_inflight not in (1, 2):
            raise InvalidArgument(f"max_inflight: must be 1 or 2, got {self.max_inflight}")
        if self.decode_jobs_per_model not in (DECODE_JOBS_AUTO, 1, 2):
            raise InvalidArgument(f"decode_jobs_per_model: must be 0 (auto), 1 or 2, got {self.decode_jobs_per_model}")
        if self.job_timeout_s <= 0:
            raise InvalidArgument(f"job_timeout_s: must be positive, got {self.job_timeout_s}")
        if self.retention_bytes < 0:
            raise InvalidArgument(f"retention_bytes: must be >= 0, got {self.retention_bytes}")
        if not (math.isfinite(self.retention_s) and self.retention_s > 0):
            raise InvalidArgument(f"retention_s: must be a positive number of seconds, got {self.retention_s}")
        if self.reset_limit < 0 or not (math.isfinite(self.reset_window_s) and self.reset_window_s > 0):
            raise InvalidArgument(
                f"reset budget: limit >= 0 and a positive window, got {self.reset_limit}/{self.reset_window_s}"
            )
        if self.restore_after_clean_jobs < 0 or self.max_recoveries < 0:
            raise InvalidArgument("restore_after_clean_jobs and max_recoveries: must be >= 0")
        if self.ccu_escalation < 0 or self.nan_escalation < 0:
            raise InvalidArgument("ccu_escalation and nan_escalation: must be >= 0 (0 = never)")
        if not (math.isfinite(self.escalation_window_s) and self.escalation_window_s > 0):
            raise InvalidArgument(
                f"escalation_window: must be a positive number of seconds, got {self.escalation_window_s}"
            )
        if self.prefix_min_tokens < 1:
            raise InvalidArgument(f"prefix_min_tokens: must be >= 1, got {self.prefix_min_tokens}")
        if self.prefill_chunk < CHUNK_OFF:
            raise InvalidArgument(f"prefill_chunk: auto (0), off (-1) or tokens >= 1, got {self.prefill_chunk}")

    def engine_config(self) -> EngineConfig:
        serial = self.policy == "serial"
        policy = SchedulingPolicy(
            max_active=1 if serial else 1 << 30,
            queue_depth=self.queue_depth,
            admission_timeout_s=self.admission_timeout_s,
            decode_jobs_per_model=self.decode_jobs_per_model,
            prefix_reuse=self.prefix_reuse,
            prefix_min_tokens=self.prefix_min_tokens,
            prefill_chunk=CHUNK_OFF if serial else self.prefill_chunk,
            prefix_reuse_forced=self.prefix_reuse and self.prefix_reuse_forced,
            prefill_chunk_forced=not serial and self.prefill_chunk != CHUNK_OFF and self.prefill_chunk_forced,
        )
        return EngineConfig(
            policy=policy,
            max_inflight=1 if serial else self.max_inflight,
            synchronous=serial,
            job_timeout_s=self.job_timeout_s,
            orphan_timeout_s=self.orphan_timeout_s,
            retention_bytes=self.retention_bytes,
            retention_s=self.retention_s,
            reset_limit=self.reset_limit,
            reset_window_s=self.reset_window_s,
            submit_error_streak=self.submit_error_streak,
            ccu_escalation=self.ccu_escalation,
            nan_escalation=self.nan_escalation,
            escalation_window_s=self.escalation_window_s,
            restore_after_clean_jobs=self.restore_after_clean_jobs,
            max_recoveries=self.max_recoveries,
        )
