"""Immutable views of the engine's state, taken in one step under the engine lock.

`Engine.snapshot()` returns an `EngineSnapshot`; `DeviceCore` builds Health, Status and WatchLoad
from it (adding what only the device or the package knows) without touching the engine again. Every
field is a copy: holding a snapshot holds no lock and nothing in it changes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from calculet.daemon.core.audit import AuditEntry
from calculet.daemon.core.kv import LaneSnapshot
from calculet.daemon.core.model_state import ModelState
from calculet.daemon.core.observe.status import (
    JobView,
    PoolView,
    PrefixCacheView,
    QueueView,
    ResetOutcome,
    SlotView,
    UtilizationView,
)
from calculet.daemon.core.prefill_offset import OffsetDecision
from calculet.daemon.core.resets.budget import BoardHalt, BudgetView


@dataclass(frozen=True)
class CounterView:
    """The engine's counters since start (Status)."""

    submitted: int = 0
    rejected: int = 0
    completed: int = 0
    cancelled: int = 0
    failed: int = 0
    decode_jobs: int = 0
    decode_rows: int = 0
    recoveries: int = 0
    resets: int = 0
    last_reset_reason: str = ""
    last_reset: ResetOutcome | None = None


@dataclass(frozen=True)
class GenerationView:
    """One model generation, as the engine sees it.

    Attributes:
        published: its alias points at it.
        waiting / running: its client jobs queued for a lane, and holding one.
        free_lanes / lanes_total: its KV lanes (0 / 0 before it is configured); free counts parked.
        prefix_cache: its prefix reuse figures (None before it is configured).
        prefix_hashes / prefix_truncated / prefix_tips: the block hashes its lanes hold
            (`prefix_advert.py`), None when prefix reuse is off; whether the bound left some out; each
            lane's last hash.
        pending_prefill_tokens / pending_short_prefill_tokens: prompt tokens its client jobs still
            have to prefill; of those, short prefills' (at most `short_prefill_tokens` when queued).
        prefill_chunk_tokens: tokens one prefill job carries (0 before it is configured).
        prefill_offset: whether it prefills at an offset, and why (None until its load decided it).
        queue_limit: requests of it that may wait for a lane beyond its free lanes (the admission
            bound, `SchedulingPolicy.queue_depth`).
        slots: its decode batch fill and fixed-slot figures (None before it is configured).
    """

    alias: str
    generation: int
    state: ModelState
    published: bool
    ready_at: float | None
    package_name: str
    package_dir: Path
    message: str
    lanes: tuple[LaneSnapshot, ...]
    queues: QueueView
    waiting: int
    running: int
    free_lanes: int
    lanes_total: int
    prefix_cache: PrefixCacheView | None = None
    prefix_hashes: tuple[int, ...] | None = None
    prefix_truncated: bool = False
    prefix_tips: tuple[int, ...] = ()
    pending_prefill_tokens: int = 0
    pending_short_prefill_tokens: int = 0
    short_prefill_tokens: int = 0
    prefill_chunk_tokens: int = 0
    queue_limit: int = 0
    slots: SlotView | None = None
    prefill_offset: OffsetDecision | None = None


@dataclass(frozen=True)
class EngineSnapshot:
    """The engine at one instant.

    Attributes:
        admitting: new Submits are accepted (not draining, not halted).
        drain_reason: why the engine drained the board itself ("" when not, or an operator did).
        device_lost: the board stopped serving (lost, crashed thread, or waiting for an operator).
        halt_note: why a board waits for an operator when the budget is not the reason ("" otherwise).
        generations: every generation not yet unloaded, oldest first.
        jobs: live client jobs (warm-up probes included), oldest first.
        inflight / inflight_limit: device jobs not yet retired, and how many may be.
        retained_jobs / retained_bytes / client_ids: finished jobs kept for Wait and Submit retries.
        reset_history: the reset audit trail, oldest first (bounded).
        utilization: device busy ratio, phase seconds and tokens (`core/utilization.py`).
    """

    admitting: bool
    device_lost: bool
    halt: BoardHalt
    budget: BudgetView
    counters: CounterView
    generations: tuple[GenerationView, ...]
    jobs: tuple[JobView, ...]
    inflight: int
    inflight_limit: int
    degraded_reason: str
    anomalies: int
    pool: PoolView
    retained_jobs: int
    retained_bytes: int
    client_ids: int
    reset_history: tuple[AuditEntry, ...] = ()
    utilization: UtilizationView = field(default_factory=UtilizationView)
    drain_reason: str = ""
    halt_note: str = ""

    @property
    def published(self) -> tuple[GenerationView, ...]:
        """Published generations, by alias."""
        return tuple(sorted((g for g in self.generations if g.published), key=lambda g: g.alias))

    @property
    def idle(self) -> bool:
        """No live job and no device job (the leak check tests use)."""
        return not self.jobs and self.inflight == 0
