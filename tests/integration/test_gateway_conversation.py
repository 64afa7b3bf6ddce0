"""Issue 19, "done when": a 5-turn conversation through the gateway with the official `openai` client.

From turn 2 on the board holding the conversation serves the previous turn's whole lane from its
parked KV (`usage.prompt_tokens_details.cached_tokens`, streamed usage), and every turn's text
equals a cold fleet's (prefix reuse off) with the same seed, bit for bit on the tiny package's
numeric kernel.

What the cache can cover is exact: the lane holds the previous prompt and the answer's tokens but
the last (never fed). Without the gateway's answer memory (the default), the new prompt re-encodes
the previous answer's text, so the match covers the previous prompt and stops where the re-encoded
answer first differs from the produced ids. With it (opt-in, docs/gateway.md, "Answer memory") the
ids the model produced stand in place of the previous answer's text, so the match runs over the
whole lane: previous prompt + previous completion - 1 tokens. The test builds the expected prompt ids
without the gateway: the first turn's by encoding the package's rendering (the daemon's GetModel
tokenizer and template), each later one as the previous prompt's ids, the answer's ids generated
directly on the cold board with the same seed and sampling (their text must be the answer), and the
encoding of the rest of the new rendering (which must extend the previous rendering and the answer).
The reported figure is checked against that and against the daemon's own count of reused tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from calculet.client import DaemonClient, SamplingParams
from calculet.gateway.text.model_text import ModelFacts, ModelText

from .conftest import DaemonProcess
from .gateway_process import GatewayProcess
from .helpers import assert_idle_soon

pytestmark = pytest.mark.integration

TURNS = 5
SYSTEM = "You are a terse assistant. " * 3
USER_LINES = ["Tell me about lanes.", "And parking?", "Why per lane?", "What drops them?", "Thanks, bye."]
MAX_TOKENS = 10
TEMPERATURE, TOP_P = 0.9, 0.95


def model_text(daemon: DaemonProcess) -> ModelText:
    with DaemonClient(daemon.target) as client:
        info = client.get_model("tiny")
    facts = ModelFacts("tiny", info.package_hash, info.vocab_size, info.context, tuple(info.eos_token_ids))
    return ModelText(facts, info.tokenizer_json, info.chat_template)


def ask(gateway: GatewayProcess, messages: list[dict[str, str]], seed: int) -> tuple[str, Any]:
    """One streamed turn; returns its text and the streamed usage."""
    with gateway.openai() as client:
        stream = client.chat.completions.create(
            model="tiny", messages=messages, max_tokens=MAX_TOKENS, seed=seed, temperature=TEMPERATURE, top_p=TOP_P,
            user="alice",
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


def answer_ids(board: DaemonProcess, prompt: list[int], seed: int) -> list[int]:
    """The answer's ids generated directly on `board` as the gateway asks for them (choice 0: the
    request's seed; the same sampling, no EOS stop, the same limit)."""
    sampling = SamplingParams(seed=seed, temperature=TEMPERATURE, top_p=TOP_P)
    with DaemonClient(board.target) as client:
        return list(client.generate("tiny", prompt, max_tokens=MAX_TOKENS, ignore_eos=True, sampling=sampling))


def reused(daemons: list[DaemonProcess]) -> int:
    total = 0
    for daemon in daemons:
        with DaemonClient(daemon.target) as client:
            total += sum(m.prefix_cache.hit_tokens for m in client.status().models)
    return total


@pytest.mark.parametrize("memory", [False, True], ids=["re-encoded", "answer-memory"])
def test_a_five_turn_conversation_reuses_the_previous_turn_and_equals_a_cold_run(
    start_daemon: Callable[..., DaemonProcess], start_gateway: Callable[..., GatewayProcess], memory: bool
) -> None:
    warm_boards = [start_daemon("--board", str(i), "--model", "tiny=tiny") for i in range(2)]
    cold_board = start_daemon("--board", "2", "--model", "tiny=tiny", "--prefix-reuse", "off")
    flags = ("--answer-memory-tokens", "4000000") if memory else ()
    warm = start_gateway(*(f for b in warm_boards for f in ("--daemon", b.target)), "--load-interval-ms", "50", *flags)
    cold = start_gateway("--daemon", cold_board.target, *flags)
    text = model_text(cold_board)

    messages: list[dict[str, str]] = [{"role": "system", "content": SYSTEM}]
    previous: tuple[int, int] | None = None  # (prompt tokens, completion tokens) of the last turn
    rendered = ""  # the previous turn's rendering
    prompt_ids: list[int] = []  # the previous turn's expected prompt ids
    last_answer_ids: list[int] = []  # the ids the model produced for the previous answer
    for turn in range(TURNS):
        last_rendered = rendered
        messages.append({"role": "user", "content": USER_LINES[turn]})
        rendered = text.render_chat(messages, add_generation_prompt=True)
        if turn == 0 or not memory:
            prompt_ids = text.encode(rendered)
        else:
            answer_text = messages[-2]["content"]
            assert rendered.startswith(last_rendered + answer_text), "the template extends the conversation"
            rest = rendered[len(last_rendered) + len(answer_text) :]
            prompt_ids = [*prompt_ids, *last_answer_ids, *text.encode(rest)]
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
            if memory:
                assert cached == last_prompt + last_completion - 1, f"turn {turn}: not the whole lane was reused"
        last_answer_ids = answer_ids(cold_board, prompt_ids, seed=70 + turn)
        assert len(last_answer_ids) == usage.completion_tokens == MAX_TOKENS
        assert text.tokenizer.decode(last_answer_ids, skip_special_tokens=True) == answer, "the oracle's answer"
        previous = (usage.prompt_tokens, usage.completion_tokens)
        messages.append({"role": "assistant", "content": answer})
    for board in warm_boards:
        with DaemonClient(board.target) as client:
            assert_idle_soon(client)
