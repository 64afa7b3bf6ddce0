"""`TokenizePool`: long texts off the caller's thread, within a budget of characters, released
when the work ends whatever its caller does; and `ModelText.encode`'s ids are the tokenizer's own."""

from __future__ import annotations

import asyncio
import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from calculet.common.errors import Overloaded, Unavailable
from calculet.gateway.text.model_text import ModelFacts, ModelText
from calculet.gateway.text.tokenize_pool import TokenizePool
from tests.unit.gateway.fakes import CHAT_TEMPLATE, EOS, byte_tokenizer_json

TEXT = ModelText(ModelFacts("m", "h", 300, 512, (EOS,)), byte_tokenizer_json(), CHAT_TEMPLATE)


def test_short_texts_run_inline_and_long_ones_on_the_pool() -> None:
    pool = TokenizePool(inline_chars=10)
    caller = threading.get_ident()

    async def scenario() -> tuple[int, int]:
        short = await pool.run(10, threading.get_ident)
        long = await pool.run(11, threading.get_ident)
        return short, long

    try:
        short, long = asyncio.run(scenario())
    finally:
        pool.close()
    assert short == caller and long != caller


def test_the_budget_refuses_past_it_and_frees_what_ended() -> None:
    pool = TokenizePool(threads=2, budget_chars=100, inline_chars=0)  # one held by the gate
    gate = threading.Event()

    async def scenario() -> None:
        first = asyncio.ensure_future(pool.run(60, gate.wait))
        while pool.admitted_chars == 0:
            await asyncio.sleep(0)
        assert pool.admitted_chars == 60
        with pytest.raises(Overloaded) as refused:
            await pool.run(41, lambda: None)
        assert refused.value.retry_after_s == 1.0 and pool.admitted_chars == 60  # nothing queued
        assert await pool.run(40, lambda: "fits") == "fits"  # 60 + 40 is within the budget
        gate.set()
        assert await first is True
        assert pool.admitted_chars == 0
        assert await pool.run(500, lambda: "alone") == "alone"  # one text alone may pass it

    try:
        asyncio.run(scenario())
    finally:
        pool.close()


def test_a_caller_that_stops_waiting_leaves_the_count_until_the_work_ends() -> None:
    pool = TokenizePool(budget_chars=100, inline_chars=0)
    gate, ended = threading.Event(), threading.Event()

    def work() -> None:
        gate.wait()
        ended.set()

    async def scenario() -> None:
        waiting = asyncio.ensure_future(pool.run(70, work))
        while pool.admitted_chars == 0:
            await asyncio.sleep(0)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert pool.admitted_chars == 70  # still running on its thread
        gate.set()
        await asyncio.to_thread(ended.wait)
        while pool.admitted_chars:
            await asyncio.sleep(0)

    try:
        asyncio.run(scenario())
    finally:
        pool.close()


def test_a_closed_pool_is_unavailable() -> None:
    pool = TokenizePool(inline_chars=0)
    pool.close()
    with pytest.raises(Unavailable):
        asyncio.run(pool.run(5, lambda: None))
    assert pool.admitted_chars == 0


PIECES = st.sampled_from(["a", " ", "\n", "é", "語", "<|im_start|>", "<|im_end|>", "x"])


@given(st.lists(PIECES, max_size=40).map("".join))
def test_encode_gives_the_tokenizers_ids(text: str) -> None:
    assert TEXT.encode(text) == TEXT.tokenizer.encode(text, add_special_tokens=False).ids


def test_max_token_chars_bounds_every_token() -> None:
    vocab = TEXT.tokenizer.get_vocab(with_added_tokens=True)
    assert TEXT.max_token_chars == max(
        len(TEXT.tokenizer.decode([i], skip_special_tokens=False)) for i in vocab.values()
    )
