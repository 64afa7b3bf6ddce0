"""Run the gateway's service over `FakeDaemon`s inside one event loop (no processes, no gRPC)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from starlette.testclient import TestClient

from calculet.gateway.api.app import create_app
from calculet.gateway.api.schemas import ChatCompletionRequest, CompletionRequest
from calculet.gateway.fleet.board import BoardState
from calculet.gateway.fleet.discovery import Discovery
from calculet.gateway.fleet.fleet import Fleet
from calculet.gateway.routing.claim import BoardClaim
from calculet.gateway.routing.policy import RoutingMode
from calculet.gateway.routing.router import Router
from calculet.gateway.routing.scoring.inputs import RouteRequest
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
    *daemons: FakeDaemon, policy: RetryPolicy | None = None, seed: int = 0, mode: RoutingMode = RoutingMode.PREFIX
) -> tuple[Fleet, GatewayService]:
    by_target = {d.target: d for d in daemons}
    fleet = Fleet(Discovery([d.target for d in daemons], []), lambda t: by_target[t])
    await fleet.start()
    await until(fleet, lambda: all(b.state is BoardState.UP for b in fleet.boards.values()), "boards up")
    service = GatewayService(fleet, Router(fleet, mode, random.Random(seed)), policy or RetryPolicy(6, 0.5))
    return fleet, service


def serving(
    *daemons: FakeDaemon, setup: Callable[[GatewayService], None] | None = None
) -> Callable[[], AsyncIterator[GatewayService]]:
    """The app's `make_service` over these fakes (`create_app(serving(...))`): the service started in
    the app's loop, `setup` applied to it (an answer memory, a catalog, ...), its fleet closed after."""

    async def make_service() -> AsyncIterator[GatewayService]:
        fleet, service = await start_service(*daemons)
        if setup is not None:
            setup(service)
        try:
            yield service
        finally:
            await fleet.close()

    return make_service


@contextmanager
def gateway(*daemons: FakeDaemon, **app: Any) -> Iterator[TestClient]:
    """The HTTP app over these fakes (`create_app(serving(...), **app)`), started; server errors raise."""
    with TestClient(create_app(serving(*daemons), **app), raise_server_exceptions=True) as client:
        yield client


async def routed(fleet: Fleet, tokens: Sequence[int] = (72, 105, 33), session: str = "") -> RouteRequest:
    """A routing request for `tokens` of the fakes' model (package "pkg-a"), once every board's
    package is known (as the service learns them before it places a choice)."""
    await fleet.packages.identify(ALIAS, list(fleet.boards.values()))
    return RouteRequest.build(ALIAS, "pkg-a", tokens, session)


def fill(
    fleet: Fleet, router: Router, request: RouteRequest, target: str, count: int, *, started: bool = True
) -> list[BoardClaim]:
    """`count` placements on board `target` (every other board excluded); `started`: their first
    token came (so they count as jobs, not as pending prefill work)."""
    others = [t for t in fleet.boards if t != target]
    placements = []
    for _ in range(count):
        placement = router.place(request, exclude=others)
        assert placement is not None and placement.board.target == target
        if started:
            placement.first_token()
        placements.append(placement)
    return placements


def counts(fleet: Fleet) -> dict[str, tuple[int, int]]:
    """target -> (this gateway's jobs there, their pending prefill tokens)."""
    return {t: (b.placed, b.pending_tokens) for t, b in fleet.boards.items()}


def no_placements(fleet: Fleet) -> bool:
    """Every count back to 0 (nothing leaked)."""
    return all(v == (0, 0) for v in counts(fleet).values())


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
