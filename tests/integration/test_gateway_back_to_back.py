"""Issue 32: conversations whose turns follow each other back to back (an agent loop) on an idle fleet
of 2 boards: every later turn goes to the board holding its conversation's lane, counted by its
`usage.prompt_tokens_details.cached_tokens`, never by a clock.

The second turn resends the first prompt, then 8 tokens standing for the answer as a chat template
re-renders it (not the ids sampled), then 56 new tokens. The first prompt is 57 tokens past a full
block, so the 7 answer tokens its lane holds (the last is never fed) complete a block: the parked
lane's tip, the one its board advertises, lies in the answer as sampled and is not in the next
prompt. The daemon still continues that lane (the next prompt resends the whole previous prompt and
the lane loses only the 7 answer tokens, docs/daemon.md "Conversations"). Before the gateway's
pick-time view (`gateway/routing/sent_prefixes.py`) its router saw no board holding the prompt, in
the window before the board's report and after it alike, and chose either board: about half the
later turns went cold to the other one. (The tiny package's lanes hold 256 tokens: two turns.)
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from calculet.common.prefix import BLOCK_TOKENS
from tests.integration.conftest import DaemonProcess
from tests.integration.gateway_process import GatewayProcess

pytestmark = pytest.mark.integration

BOARDS = 2
CONVERSATIONS = 24
TURNS = 2
ANSWER = 8
NEW = BLOCK_TOKENS - ANSWER  # each turn adds one block: answer + new message
PAST_BLOCK = BLOCK_TOKENS - (ANSWER - 1)  # the fed answer tokens complete the prompt's last block

StartDaemon = Callable[..., DaemonProcess]
StartGateway = Callable[..., GatewayProcess]


def first_prompt(conversation: int) -> list[int]:
    """1 full block and 57 tokens, distinct per conversation from token 0."""
    return [20 + conversation, *((i * 37 + conversation * 11) % 400 + 20 for i in range(BLOCK_TOKENS + PAST_BLOCK - 1))]


def test_back_to_back_turns_on_an_idle_fleet_find_their_lane_every_time(
    start_daemon: StartDaemon, start_gateway: StartGateway
) -> None:
    boards = [start_daemon("--board", str(i), "--model", "tiny=tiny") for i in range(BOARDS)]
    gateway = start_gateway(*(f for b in boards for f in ("--daemon", b.target)))  # reports once a second
    gateway.wait_until(lambda body: body["models"] == {"tiny": BOARDS}, "every board ready")
    served: list[tuple[int, int, int, int]] = []  # (conversation, turn, previous prompt, cached)
    with gateway.http() as http:
        for conversation in range(CONVERSATIONS):
            prompt, previous = first_prompt(conversation), 0
            for turn in range(1, TURNS + 1):
                body = {"model": "tiny", "prompt": prompt, "max_tokens": ANSWER, "ignore_eos": True, "seed": turn}
                response = http.post("/v1/completions", json=body)  # sent the moment the last one ended
                assert response.status_code == 200, response.text
                usage = response.json()["usage"]
                assert usage["prompt_tokens"] == len(prompt)
                if turn > 1:
                    served.append((conversation, turn, previous, usage["prompt_tokens_details"]["cached_tokens"]))
                previous = len(prompt)
                rerendered = [(turn * 7 + i) % 50 + 450 for i in range(ANSWER)]
                prompt = [*prompt, *rerendered, *((i * 13 + turn) % 400 + 20 for i in range(NEW))]
    assert len(served) == CONVERSATIONS * (TURNS - 1)
    missed = [s for s in served if s[3] < s[2] // BLOCK_TOKENS * BLOCK_TOKENS]
    assert missed == [], (
        f"later turns served away from their lane (conversation, turn, previous prompt, cached): {missed}"
    )
    assert all(cached > 0 for *_, cached in served)
