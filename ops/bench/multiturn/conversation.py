"""Running the conversations: every user at once, each turn after the previous answer and a think.

`run_conversations(workload, send)` starts one task per user (a user is open loop: it starts at
its offset, `Conversation.start_s` after the run began, whatever the others do). User u's turn k
sends `TurnRequest(messages = [system prompt], user 1, answer 1, ..., user k)`, the answers being
the text streamed back, with `max_tokens` = the workload's answer tokens and index `first_index +
u * turns + (k - 1)`; after a turn that succeeded it waits its think time, then sends the next. A
failed turn ends its conversation: the next turn would need the answer it did not get, so the
user's remaining turns are not sent (the per-turn figures count them as skipped).

The clock and the sleep are injectable, so tests check the messages and the order without
waiting; `send` (`ChatBackend.send`) never raises for a failed turn. Every finished record goes to
`on_done` (the progress bar). Returns the records ordered by (user, turn).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from calculet.ops.bench.multiturn.turns import ASSISTANT, SYSTEM, USER, TurnMessage, TurnRecord, TurnRequest
from calculet.ops.bench.multiturn.workload import Conversation, MultiturnWorkload

SendTurn = Callable[[TurnRequest], Awaitable[TurnRecord]]
Sleep = Callable[[float], Awaitable[None]]


async def run_conversations(
    workload: MultiturnWorkload,
    send: SendTurn,
    *,
    first_index: int = 0,
    on_done: Callable[[TurnRecord], None] | None = None,
    clock: Callable[[], float] = time.perf_counter,
    sleep: Sleep = asyncio.sleep,
) -> list[TurnRecord]:
    """Run every conversation of `workload` through `send` (module docstring).

    Raises:
        Whatever `send` raises (a bug: failed turns are records, not exceptions).
    """
    start = clock()
    spec = workload.spec
    system = () if workload.system is None else (TurnMessage(SYSTEM, workload.system.text),)
    done: list[TurnRecord] = []

    async def user(conv: Conversation) -> None:
        delay = start + conv.start_s - clock()
        if delay > 0:
            await sleep(delay)
        history = list(system)
        for turn, message in enumerate(conv.messages, start=1):
            history.append(TurnMessage(USER, message.text))
            index = first_index + conv.user * spec.turns + (turn - 1)
            record = await send(TurnRequest(conv.user, turn, index, tuple(history), spec.answer_tokens))
            done.append(record)
            if on_done is not None:
                on_done(record)
            if not record.ok:
                return
            history.append(TurnMessage(ASSISTANT, record.answer))
            if turn < len(conv.messages) and conv.think_s[turn - 1] > 0:
                await sleep(conv.think_s[turn - 1])

    async with asyncio.TaskGroup() as group:
        for conv in workload.conversations:
            group.create_task(user(conv))
    return sorted(done, key=lambda r: (r.user, r.turn))
