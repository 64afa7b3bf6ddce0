"""One multi-turn run: warm-up chats, device sample, the conversations, device sample, figures.

Order (all on the caller's asyncio loop), as `runner.run_bench` does for independent requests:
1. warm-up: the workload's warm-up messages, each a one-turn chat without the system prompt, at most
   `WARMUP_CONCURRENCY` at a time (indexes 0 .. W-1); their records are dropped, failures counted;
2. each board's utilisation sample (`device_stats.sample_boards`);
3. the window starts; `conversation.run_conversations` (indexes from W on), each record to `on_done`;
4. the samples again; `summary.summarize` over every measured turn (request throughput, output
   throughput, goodput, TTFT/TPOT/ITL/E2E) and `device_stats.board_utilization`.

The result is a `BenchResult` (so the common report, table, plot and timing-model section apply
unchanged) plus the turns' records, from which `report.multiturn_json` makes the per-turn figures.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from calculet.ops.bench.device_stats import StatusOf, board_utilization, fleet_busy_ratio, sample_boards
from calculet.ops.bench.multiturn.conversation import SendTurn, Sleep, run_conversations
from calculet.ops.bench.multiturn.turns import USER, TurnMessage, TurnRecord, TurnRequest
from calculet.ops.bench.multiturn.workload import MultiturnWorkload
from calculet.ops.bench.runner import BenchResult
from calculet.ops.bench.slo import Slo
from calculet.ops.bench.summary import summarize

WARMUP_CONCURRENCY = 16


@dataclass(frozen=True)
class MultiturnResult:
    """A finished multi-turn run: the common result and the measured turns (by user, then turn)."""

    bench: BenchResult
    turns: tuple[TurnRecord, ...]


async def _warm_up(workload: MultiturnWorkload, send: SendTurn) -> list[TurnRecord]:
    gate = asyncio.Semaphore(WARMUP_CONCURRENCY)
    answer = workload.spec.answer_tokens

    async def one(index: int) -> TurnRecord:
        async with gate:
            message = TurnMessage(USER, workload.warmup[index].text)
            return await send(TurnRequest(user=index, turn=0, index=index, messages=(message,), max_tokens=answer))

    return list(await asyncio.gather(*(one(i) for i in range(len(workload.warmup)))))


async def run_multiturn(
    workload: MultiturnWorkload,
    send: SendTurn,
    slo: Slo,
    board_targets: Sequence[str],
    status_of: StatusOf,
    on_done: Callable[[TurnRecord], None] | None = None,
    sleep: Sleep = asyncio.sleep,
) -> MultiturnResult:
    """Run `workload` (see the module docstring).

    Raises:
        CalculetError: only from `send` bugs; failed turns are records.
    """
    warmed = await _warm_up(workload, send)
    before = await sample_boards(board_targets, status_of)
    window_start = time.perf_counter()
    turns = await run_conversations(workload, send, first_index=len(workload.warmup), on_done=on_done, sleep=sleep)
    after = await sample_boards(board_targets, status_of)
    boards = tuple(board_utilization(before[t], after[t]) for t in board_targets)
    records = sorted((t.record for t in turns), key=lambda r: r.index)
    bench = BenchResult(
        summary=summarize(records, window_start, slo),
        boards=boards,
        busy_ratio=fleet_busy_ratio(boards),
        records=tuple(records),
        window_start=window_start,
        warmup_failed=sum(1 for r in warmed if not r.ok),
    )
    return MultiturnResult(bench, tuple(turns))
