"""Issue 19, "done when": a 5-turn conversation through the gateway with the official `openai` client.

From turn 2 on the board holding the conversation serves the previous turn's prompt from its parked
lane (`usage.prompt_tokens_details.cached_tokens`, streamed usage), and every turn's text equals a
cold fleet's (prefix reuse off) with the same seed, bit for bit on the tiny package's numeric kernel.

What the cache can cover is exact: the lane holds the previous prompt and the answer's tokens but
the last (never fed); the new prompt is the template re-rendering the conversation, so the match
runs over the whole previous prompt and then as far as the re-encoded answer text agrees with the
tokens the model produced. The test computes the previous prompt's tokens with the gateway's own
renderer (`ModelText`, from the daemon's GetModel) and checks the reported figure against that and
against the daemon's own count of reused tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from calculet.client import DaemonClient
from calculet.gateway.text.model_text import ModelFacts, ModelText

from .conftest import DaemonProcess
from .gateway_process import GatewayProcess
from .helpers import assert_idle_soon

pytestmark = pytest.mark.integration

TURNS = 5
SYSTEM = "You are a terse assistant. " * 3
USER_LINES = ["Tell me about lanes.", "And parking?", "Why per lane?", "What drops them?", "Thanks, bye."]


def model_text(daemon: DaemonProcess) -> ModelText:
    with DaemonClient(daemon.target) as client:
        info = client.get_model("tiny")
    facts = ModelFacts("tiny", info.package_hash, info.vocab_size, info.context, tuple(info.eos_token_ids))
    return ModelText(facts, info.tokenizer_json, info.chat_template)


def ask(gateway: GatewayProcess, messages: list[dict[str, str]], seed: int) -> tuple[str, Any]:
    """One streamed turn; returns its text and the streamed usage."""
    with gateway.openai() as client:
        stream = client.chat.completions.create(
            model="tiny", messages=messages, max_tokens=10, seed=seed, temperature=0.9, top_p=0.95, user="alice",
            stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
        )  # fmt: skip
        text, usage = "", None
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                text += chunk.choices[0].delta.content
            if chunk.usage is not None:
                usage = chunk.usage
    assert usage is not None, "streamed usage was asked for"
    return text, usage


def reused(daemons: list[DaemonProcess]) -> int:
    total = 0
    for daemon in daemons:
        with DaemonClient(daemon.target) as client:
            total += sum(m.prefix_cache.hit_tokens for m in client.status().models)
    return total


def test_a_five_turn_conversation_reuses_the_previous_turn_and_equals_a_cold_run(
    start_daemon: Callable[..., DaemonProcess], start_gateway: Callable[..., GatewayProcess]
) -> None:
    warm_boards = [start_daemon("--board", str(i), "--model", "tiny=tiny") for i in range(2)]
    cold_board = start_daemon("--board", "2", "--model", "tiny=tiny", "--prefix-reuse", "off")
    warm = start_gateway(*(f for b in warm_boards for f in ("--daemon", b.target)), "--load-interval-ms", "50")
    cold = start_gateway("--daemon", cold_board.target)
    text = model_text(cold_board)

    messages: list[dict[str, str]] = [{"role": "system", "content": SYSTEM}]
    previous: tuple[int, int] | None = None  # (prompt tokens, completion tokens) of the last turn
    for turn in range(TURNS):
        messages.append({"role": "user", "content": USER_LINES[turn]})
        prompt_ids = text.encode(text.render_chat(messages, add_generation_prompt=True))
        before = reused(warm_boards)
        answer, usage = ask(warm, messages, seed=70 + turn)
        cold_answer, cold_usage = ask(cold, messages, seed=70 + turn)
        assert answer == cold_answer, f"turn {turn}: the text differs from the cold run"
        assert usage.prompt_tokens == cold_usage.prompt_tokens == len(prompt_ids)
        cached = usage.prompt_tokens_details.cached_tokens
        assert cold_usage.prompt_tokens_details.cached_tokens == 0
        assert reused(warm_boards) - before == cached, "the gateway reports what the daemon reused"
        if previous is None:
            assert cached == 0
        else:
            last_prompt, last_completion = previous
            assert cached >= last_prompt, f"turn {turn}: the previous prompt ({last_prompt} tokens) was not reused"
            assert cached <= last_prompt + last_completion - 1, "never more than the lane held"
        previous = (usage.prompt_tokens, usage.completion_tokens)
        messages.append({"role": "assistant", "content": answer})
    for board in warm_boards:
        with DaemonClient(board.target) as client:
            assert_idle_soon(client)
