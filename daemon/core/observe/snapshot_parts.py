"""Builds the parts of an `EngineSnapshot` (`snapshot.py`) from the engine's components: one view per
generation, the buffer pools' totals, one view per live job. Called by `Engine.snapshot` under the
engine lock; each function only reads what it is given and returns frozen copies.
"""

from __future__ import annotations

from collections.abc import Iterable

from calculet.daemon.core.client_job import ClientJob, SeqState
from calculet.daemon.core.generations import GenerationTable
from calculet.daemon.core.observe.prefix_views import lane_chains, pending_prefill_tokens, prefix_cache_view
from calculet.daemon.core.observe.snapshot import GenerationView
from calculet.daemon.core.observe.status import JobView, PoolView, QueueView, SlotView
from calculet.daemon.core.prefix_advert import advertise, tips
from calculet.daemon.core.runtime import ModelRuntime
from calculet.daemon.core.scheduler import Scheduler, SchedulingPolicy


def generation_view(
    rt: ModelRuntime, seqs: list[ClientJob], table: GenerationTable, scheduler: Scheduler, policy: SchedulingPolicy
) -> GenerationView:
    """One generation: its state, lanes, queues, prefix cache and what its jobs still have to prefill.

    Args:
        seqs: every live job of the board (its own are picked out).
        table: the board's generations (whether its alias points at it).
    """
    mine = [s for s in seqs if s.generation == rt.generation]
    waiting = sum(1 for s in mine if s.state is SeqState.WAITING)
    kv = rt.kv
    prefix = prefix_cache_view(rt, policy)
    chains = lane_chains(rt, mine) if prefix is not None and prefix.enabled else None
    hashes, truncated = advertise(chains) if chains is not None else (None, False)
    short_bound = policy.short_prefill_tokens
    pending, pending_short = pending_prefill_tokens(rt, mine, short_bound)
    return GenerationView(
        alias=rt.alias,
        generation=rt.generation,
        state=rt.state,
        published=table.is_published(rt),
        ready_at=rt.ready_at,
        package_name=rt.manifest.name,
        package_dir=rt.package_dir,
        message=rt.message,
        lanes=kv.snapshot() if kv is not None else (),
        queues=QueueView(*scheduler.depths(rt.generation, mine)),
        waiting=waiting,
        running=len(mine) - waiting,
        free_lanes=kv.free_count() if kv is not None else 0,
        lanes_total=kv.lanes if kv is not None else 0,
        prefix_cache=prefix,
        prefix_hashes=hashes,
        prefix_truncated=truncated,
        prefix_tips=tips(chains) if chains is not None else (),
        pending_prefill_tokens=pending,
        pending_short_prefill_tokens=pending_short,
        short_prefill_tokens=short_bound,
        prefill_chunk_tokens=rt.prefill_chunk,
        queue_limit=policy.queue_depth,
        slots=slot_view(rt),
        prefill_offset=rt.offset,
    )


def pool_view(generations: Iterable[ModelRuntime]) -> PoolView:
    """The job buffers of every generation's pool, summed."""
    in_use = free = quarantined = waits = 0
    for rt in generations:
        if rt.pool is None:
            continue
        st = rt.pool.stats()
        in_use += st.in_use
        quarantined += st.quarantined
        waits += st.acquire_misses
        free += sum(k.free for k in st.per_key.values())
    return PoolView(in_use, free, quarantined, waits)


def job_view(s: ClientJob, now: float) -> JobView:
    return JobView(
        s.job_id,
        s.request.model,
        s.generation,
        s.state.name,
        s.lane,
        len(s.request.prompt_tokens),
        len(s.generated),
        s.request.priority,
        now - s.t_submit,
        s.request.client_request_id,
    )


def slot_view(rt: ModelRuntime) -> SlotView | None:
    """The generation's decode rows and fixed-slot figures (`compaction.SlotStats`); None before it
    is configured."""
    if rt.kv is None:
        return None
    stats, rule = rt.slots, rt.fixed_slots
    return SlotView(
        fixed=rule is not None,
        inactive_rows=rule.value if rule is not None else "",
        active_rows=stats.active_rows,
        compiled_rows=stats.compiled_rows,
        compactions=stats.compactions,
        compacted_tokens=stats.compacted_tokens,
    )
