"""Interleave the events of several choices (OpenAI `n` > 1, or several prompts) as they come.

Each choice runs in its own task and pushes `(choice index, event)` into one queue; the merged
iterator yields them in arrival order and re-raises the first error. Closing the iterator early
(client gone) cancels every task, whose runners then cancel their daemon jobs. One choice needs
no task: its events are yielded directly. However it ends, every runner is closed on the way out
(`ChoiceRunner.close`), so a runner whose task was cancelled before it ever ran still releases
its placement.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Sequence

from calculet.gateway.serving.choice import ChoiceEvent, ChoiceRunner

_DONE = object()


async def merged(runners: Sequence[ChoiceRunner]) -> AsyncGenerator[tuple[int, ChoiceEvent], None]:
    """`(index, event)` of every runner, in arrival order.

    Raises:
        CalculetError: the first error of any choice (the others are then cancelled).
    """
    if len(runners) == 1:
        try:
            async with contextlib.aclosing(runners[0].run()) as events:
                async for event in events:
                    yield 0, event
        finally:
            runners[0].close()
        return
    queue: asyncio.Queue[tuple[int, object]] = asyncio.Queue()

    async def pump(index: int, runner: ChoiceRunner) -> None:
        try:
            async with contextlib.aclosing(runner.run()) as events:
                async for event in events:
                    await queue.put((index, event))
            await queue.put((index, _DONE))
        except Exception as err:
            await queue.put((index, err))

    tasks = [asyncio.create_task(pump(i, r)) for i, r in enumerate(runners)]
    try:
        left = len(tasks)
        while left:
            index, item = await queue.get()
            if item is _DONE:
                left -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield index, item  # type: ignore[misc]
    finally:
        for task in tasks:
            task.cancel()
        try:
            await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            for runner in runners:
                runner.close()
