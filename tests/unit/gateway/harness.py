"""Run the gateway's service over `FakeDaemon`s inside one event loop (no processes, no gRPC)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable

from calculet.gateway.api.schemas import ChatCompletionRequest, CompletionRequest
from calculet.gateway.fleet.board import BoardState
from calculet.gateway.fleet.discovery import Discovery
from calculet.gateway.fleet.fleet import Fleet
from calculet.gateway.fleet.router import Router
from calculet.gateway.serving.choice import ChoiceDelta, ChoiceEnd, RetryPolicy
from calculet.gateway.serving.service import GatewayService, Prepared
from tests.unit.gateway.fakes import ALIAS, FakeDaemon

WAIT_S = 10.0  # a deadline for things that happen on their own within the loop, never a pace


async def until(fleet: Fleet, condition: Callable[[], bool], what: str) -> None:
    """Wait for fleet changes until `condition` holds. Raises: AssertionError at the deadline."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_S
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await fleet.wait_changed(0.05)


async def start_service(
    *daemons: FakeDaemon, policy: RetryPolicy | None = None, seed: int = 0
) -> tuple[Fleet, GatewayService]:
    by_target = {d.target: d for d in daemons}
    fleet = Fleet(Discovery([d.target for d in daemons], []), lambda t: by_target[t])
    await fleet.start()
    await until(fleet, lambda: all(b.state is BoardState.UP for b in fleet.boards.values()), "boards up")
    service = GatewayService(fleet, Router(fleet, random.Random(seed)), policy or RetryPolicy(6, 0.5))
    return fleet, service


def completion(prompt: str | list[int], **fields: object) -> CompletionRequest:
    return CompletionRequest(model=ALIAS, prompt=prompt, **fields)  # type: ignore[arg-type]


def chat(content: str, **fields: object) -> ChatCompletionRequest:
    return ChatCompletionRequest(model=ALIAS, messages=[{"role": "user", "content": content}], **fields)  # type: ignore[list-item]


async def run_all(prepared: Prepared) -> tuple[dict[int, str], dict[int, ChoiceEnd], dict[int, list[int]]]:
    """Every choice's text, end and tokens."""
    texts: dict[int, str] = {}
    ends: dict[int, ChoiceEnd] = {}
    tokens: dict[int, list[int]] = {}
    async for index, event in prepared.events():
        if isinstance(event, ChoiceDelta):
            texts[index] = texts.get(index, "") + event.text
            tokens.setdefault(index, []).extend(event.tokens)
        else:
            ends[index] = event
    return texts, ends, tokens
