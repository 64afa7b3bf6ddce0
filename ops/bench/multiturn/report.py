"""The report's `multiturn` section (docs/benchmarking.md, "Multi-turn conversations"), from the turns'
records, the spec and, with `--timing-package`, the timing model.

Keys: `users`, `turns`, `skipped` (turns not sent: their conversation had failed),
`cache_reported` (completed requests whose usage carried `prompt_tokens_details.cached_tokens`),
`cached_share` (all turns) and `cached_share_later` (turns >= 2), `per_turn[]` (`per_turn.TurnStats`
with TTFT in ms, and `modelled_uncached_ttft_ms`: the p50 over the turn's requests of the modelled
uncached prefill plus one decode step at the time scale, `model_cost`; null without a timing model),
`later_turns` (turns >= 2 pooled: `requests`, `missed` (`per_turn.TurnStats.missed`), `ttft_p50_ms`,
`modelled_uncached_ttft_p50_ms`, `ttft_bound_ms`) and `targets[]` (issue 19's per-run targets,
`targets.TargetCheck`). A figure that cannot be computed is null. Pure; no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from calculet.ops.bench.latency import request_latency
from calculet.ops.bench.limit import rows_at_load
from calculet.ops.bench.multiturn.model_cost import uncached_ttft_s
from calculet.ops.bench.multiturn.per_turn import TurnStats, cached_share, turn_stats
from calculet.ops.bench.multiturn.targets import cache_target, ttft_bound_s, ttft_target
from calculet.ops.bench.multiturn.turns import TurnRecord
from calculet.ops.bench.relative import TimingContext, mean_in_flight
from calculet.ops.bench.report import latency_ms
from calculet.ops.bench.summary import LatencyStats


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


def modelled_wall_s(turns: Sequence[TurnRecord], timing: TimingContext | None, duration_s: float) -> dict[int, float]:
    """Per completed record's index: its modelled uncached TTFT at the time scale (wall seconds);
    empty without a timing model."""
    done = [t for t in turns if t.ok]
    if timing is None or not done:
        return {}
    load = mean_in_flight([t.record for t in done], duration_s)
    rows = rows_at_load(timing.model, timing.serving, load, timing.boards)
    return {
        t.record.index: timing.time_scale
        * uncached_ttft_s(timing.model, max(1, t.record.prompt_tokens or 1), t.cached_tokens, rows)
        for t in done
    }


def _turn_json(stats: TurnStats, modelled: Sequence[float]) -> dict[str, Any]:
    return {
        "turn": stats.turn,
        "sent": stats.sent,
        "completed": stats.completed,
        "failed": stats.failed,
        "skipped": stats.skipped,
        "prompt_tokens": stats.prompt_tokens,
        "cached_tokens": stats.cached_tokens,
        "cached_share": stats.cached_share,
        "carried_tokens": stats.carried_tokens,
        "carried_share": stats.carried_share,
        "missed": stats.missed,
        "output_tokens": stats.output_tokens,
        "ttft_ms": latency_ms(stats.ttft),
        "modelled_uncached_ttft_ms": _ms(LatencyStats.of(modelled).p50),
    }


def multiturn_json(
    turns: Sequence[TurnRecord], users: int, turns_per_user: int, timing: TimingContext | None, duration_s: float
) -> dict[str, Any]:
    """The `multiturn` section (module docstring).

    Args:
        turns: the measured turns' records.
        users: conversations in the run.
        turns_per_user: turns each was to have.
        timing: the timing model, or None without `--timing-package`.
        duration_s: the measured window (for the load the timing model's rows come from).
    """
    stats = turn_stats(turns, users, turns_per_user)
    modelled = modelled_wall_s(turns, timing, duration_s)
    by_turn = [[modelled[t.record.index] for t in turns if t.ok and t.turn == s.turn and modelled] for s in stats]
    later = [t for t in turns if t.ok and t.turn >= 2]
    ttft_p50 = LatencyStats.of([request_latency(t.record).ttft for t in later]).p50
    modelled_p50 = LatencyStats.of([modelled[t.record.index] for t in later if modelled]).p50
    later_share = cached_share(turns, first_turn=2)
    return {
        "users": users,
        "turns": turns_per_user,
        "skipped": sum(s.skipped for s in stats),
        "cache_reported": sum(1 for t in turns if t.ok and t.cache_reported),
        "cached_share": cached_share(turns),
        "cached_share_later": later_share,
        "per_turn": [_turn_json(s, m) for s, m in zip(stats, by_turn, strict=True)],
        "later_turns": {
            "requests": len(later),
            "missed": sum(s.missed for s in stats),
            "ttft_p50_ms": _ms(ttft_p50),
            "modelled_uncached_ttft_p50_ms": _ms(modelled_p50),
            "ttft_bound_ms": None if modelled_p50 is None else _ms(ttft_bound_s(modelled_p50)),
        },
        "targets": [cache_target(later_share).as_json(), ttft_target(ttft_p50, modelled_p50).as_json()],
    }
