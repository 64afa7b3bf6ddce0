"""Health, Status and WatchLoad views built from one `EngineSnapshot` plus what only the device
knows (pure functions: no lock, no engine, no device call)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from calculet.daemon.core.observe.snapshot import EngineSnapshot, GenerationView
from calculet.daemon.core.observe.status import (
    HealthView,
    LoadView,
    ModelChipMemoryView,
    ModelHealthView,
    ModelLoadView,
    ModelView,
    StatusView,
)
from calculet.daemon.core.unload_check import ChipExcess, excess_text
from calculet.daemon.device.types import DeviceInfo, JobCounters, MemoryUsage


def health_view(snap: EngineSnapshot, device_healthy: bool) -> HealthView:
    """The board's health: serving when the device is healthy, it admits, and a model is Ready."""
    healthy = device_healthy and not snap.device_lost
    # A board the engine drained itself (a submit-error streak) is NOT_SERVING with the reason, not
    # DRAINING: nobody asked for it, and it stays so until an operator resumes it.
    draining = healthy and not snap.admitting and not snap.drain_reason
    models = tuple(ModelHealthView(g.alias, g.generation, g.state) for g in snap.published)
    ready = any(m.state.serving for m in models)
    if not healthy:
        reason = snap.halt_note or (
            "automatic reset budget exhausted" if snap.budget.exhausted else "device lost or unusable"
        )
    elif snap.drain_reason:
        reason = snap.drain_reason
    elif draining:
        reason = "draining"
    elif not ready:
        reason = "no model is ready"
    else:
        reason = ""
    return HealthView(reason == "", draining, healthy, models, snap.budget, reason)


def load_view(
    board: str, snap: EngineSnapshot, health: HealthView, package_hash: Callable[[GenerationView], str]
) -> LoadView:
    """WatchLoad's report: per published generation, queued and running jobs, free (and parked)
    lanes, prefill work pending, the block hashes of what its lanes hold and its package hash."""
    models = tuple(
        ModelLoadView(
            g.alias,
            g.generation,
            g.state,
            g.state.serving,
            g.waiting,
            g.running,
            g.free_lanes,
            g.lanes_total,
            g.prefix_cache.parked_lanes if g.prefix_cache is not None else 0,
            g.pending_prefill_tokens,
            g.prefix_hashes,
            g.prefix_truncated,
            package_hash(g),
            g.prefix_tips,
            g.pending_short_prefill_tokens,
            g.short_prefill_tokens,
            g.queue_limit,
        )
        for g in snap.published
    )
    return LoadView(board, health.serving, health.draining, models)


@dataclass(frozen=True)
class PackageIdentity:
    """What Status says of a generation's package: its path as operators name it, its manifest
    hash, its compiler identities and its calbin hash (`package/identity.py`); "" / () when the
    package cannot be read."""

    path: str
    package_hash: str = ""
    compiler: tuple[tuple[str, str], ...] = ()
    calbin_sha256: str = ""


def model_view(g: GenerationView, package: PackageIdentity, memory: tuple[ModelChipMemoryView, ...] = ()) -> ModelView:
    return ModelView(
        g.alias,
        g.generation,
        g.state,
        g.published,
        g.ready_at,
        g.package_name,
        package.path,
        g.lanes,
        g.queues,
        g.message,
        package.package_hash,
        g.prefix_cache,
        g.prefill_chunk_tokens,
        package.compiler,
        package.calbin_sha256,
        memory,
        g.slots,
        g.prefill_offset,
    )


def status_view(
    *,
    snap: EngineSnapshot,
    health: HealthView,
    identity: tuple[int, str, float, bool, str],
    device: tuple[DeviceInfo, MemoryUsage, JobCounters],
    describe: Callable[[GenerationView], PackageIdentity],
    memory_excess: tuple[ChipExcess, ...] = (),
    model_memory: Callable[[GenerationView], tuple[ModelChipMemoryView, ...]] = lambda _g: (),
) -> StatusView:
    """Status from a snapshot.

    Args:
        identity: (board, driver, started_at, fault_injection, policy).
        device: the device's identity, memory and counters.
        describe: a generation's package identity.
        memory_excess: what each chip held above its baseline when last measured.
        model_memory: a generation's memory per chip, planned and measured.
    """
    board, driver, started_at, fault_injection, policy = identity
    info, memory, counters = device
    c = snap.counters
    return StatusView(
        board=board,
        driver=driver,
        started_at=started_at,
        fault_injection=fault_injection,
        device=info,
        memory=memory,
        models=tuple(model_view(g, describe(g), model_memory(g)) for g in snap.generations),
        jobs=snap.jobs,
        device_counters=counters,
        accepted=c.submitted,
        rejected=c.rejected,
        completed=c.completed,
        cancelled=c.cancelled,
        failed=c.failed,
        recoveries=c.recoveries,
        pool=snap.pool,
        resets=c.resets,
        last_reset_reason=c.last_reset_reason,
        last_reset=c.last_reset,
        policy=policy,
        max_inflight=snap.inflight_limit,
        inflight=snap.inflight,
        draining=not snap.admitting,
        health=health,
        degraded_reason=snap.degraded_reason,
        anomalies=snap.anomalies,
        reset_history=snap.reset_history,
        utilization=snap.utilization,
        memory_excess=memory_excess,
        warnings=memory_warnings(memory_excess),
    )


def memory_warnings(excess: tuple[ChipExcess, ...]) -> tuple[str, ...]:
    """Status's warning when a chip holds memory no configured model accounts for (docs/daemon.md,
    "Device memory"): a leak, or memory held outside the daemon."""
    held = excess_text(excess)
    if not held:
        return ()
    return (
        f"device memory above its baseline: {held}, held by no configured model; a configuration reset "
        "with a model loaded, or a restart, reclaims it",
    )
