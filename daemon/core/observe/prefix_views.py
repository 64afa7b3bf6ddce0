"""What a generation reports of its prefix reuse and prefill work (Status, WatchLoad), computed from
its runtime and its sequences: pure functions, called by the engine under its lock while it takes a
snapshot (`Engine._generation_view_locked`).

- `prefix_cache_view`: the generation's `PrefixStats` and parked lanes, as Status shows them;
- `lane_chains`: the block-hash chain of what each lane holds (parked histories, and the committed
  KV of running client sequences, hashed once per block and kept by each sequence), which
  `prefix_advert` turns into the bounded advertisement and the lanes' tips;
- `pending_prefill_tokens`: prompt tokens the generation's client jobs still have to prefill, the
  device work queued ahead of a new prompt there (a router's work-ahead term), and the part of it
  that short prefills hold (served first: all a new short prompt waits for).
"""

from __future__ import annotations

from calculet.daemon.core.client_job import ClientJob, SeqState
from calculet.daemon.core.observe.status import PrefixCacheView
from calculet.daemon.core.runtime import ModelRuntime
from calculet.daemon.core.scheduler import SchedulingPolicy

# States in which a sequence still has prefill work (queued, part-way, in a prefill job, recovering).
_PREFILLING = frozenset({SeqState.WAITING, SeqState.PARTIAL, SeqState.PREFILL, SeqState.RECOVER})

Chain = tuple[int, ...] | list[int]


def prefix_cache_view(rt: ModelRuntime, policy: SchedulingPolicy) -> PrefixCacheView | None:
    """The generation's prefix reuse figures; None before it is configured."""
    if rt.kv is None:
        return None
    stats = rt.prefix
    return PrefixCacheView(
        rt.prefix_reuse, policy.prefix_min_tokens, rt.kv.parked_count(), stats.hit_tokens,
        stats.miss_tokens, stats.hits, stats.misses, stats.evictions, stats.dropped,
    )  # fmt: skip


def lane_chains(rt: ModelRuntime, mine: list[ClientJob]) -> list[Chain]:
    """Each lane's block-hash chain: parked lanes' histories, then running client sequences' KV.

    Args:
        rt: a configured generation.
        mine: its live sequences.
    """
    assert rt.kv is not None
    chains: list[Chain] = [parked.hashes for _, parked in rt.kv.parked()]
    for seq in mine:
        if seq.lane is not None and not seq.internal:
            chains.append(seq.block_hashes(rt.kv.lane(seq.lane).length))
    return chains


def pending_prefill_tokens(rt: ModelRuntime, mine: list[ClientJob], short_tokens: int) -> tuple[int, int]:
    """Prompt (+ resumed) tokens the generation's client jobs have yet to prefill: all of them, and
    those of short prefills (queued with at most `short_tokens` to prefill). A job still waiting for
    a lane counts what it was expected to prefill when queued (less the prefix of the parked lane it
    continues), not its whole prompt: a router reading the report would otherwise see a
    conversation's queued next turn as its whole history of work ahead.

    Args:
        rt: the generation.
        mine: its live sequences.
        short_tokens: the scheduler's short-prefill bound.
    """
    kv, pending, short = rt.kv, 0, 0
    for seq in mine:
        if seq.internal or seq.state not in _PREFILLING:
            continue
        if seq.lane is None and seq.expected_uncached > 0:
            left = seq.expected_uncached  # still queued: what the parked lane it will take leaves to do
        else:
            held = kv.lane(seq.lane).length if kv is not None and seq.lane is not None else 0
            left = len(seq.prompt) + len(seq.generated) - held
        pending += left
        short += left if seq.expected_uncached <= short_tokens else 0
    return pending, short
