"""The request pool: seeded and complete, its OpenAI bodies, conversations carrying their answers,
and the shapes the timing model sees."""

from __future__ import annotations

import pytest

from calculet.common.errors import InvalidArgument
from calculet.ops.soak.mix import (
    KIND_SHARES,
    TEMPLATE_TOKENS_PER_MESSAGE,
    ClientMove,
    build_pool,
    mix_shape,
    request_shapes,
)
from tests.unit.ops.soak.factories import spec


def words(text: str) -> int:
    return len(text.split())


def test_the_pool_is_seeded_and_has_every_kind_in_its_share() -> None:
    shape = mix_shape(256)
    pool = build_pool(100, 3, shape, words)
    assert pool == build_pool(100, 3, shape, words)
    assert pool != build_pool(100, 4, shape, words)
    kinds = {kind: sum(s.kind == kind for s in pool) for kind, _ in KIND_SHARES}
    assert kinds == {"short": 36, "long": 10, "n": 12, "disconnect": 12, "timeout": 8, "conversation": 22}
    assert len({s.seed for s in pool}) == 100 and {s.temperature for s in pool} == {0.0, 0.8, 1.0}


def test_each_kind_has_its_client_behaviour() -> None:
    pool = build_pool(60, 0, mix_shape(256), words)
    for s in pool:
        disconnect, timeout = s.kind == "disconnect", s.kind == "timeout"
        assert (s.move is ClientMove.DISCONNECT) == disconnect == (s.disconnect_after > 0)
        assert (s.move is ClientMove.TIMEOUT) == timeout == (s.timeout_fraction > 0)
        assert (s.n > 1) == (s.kind == "n") and (s.turns > 1) == (s.kind == "conversation")
        assert (not s.stream if timeout else True) and (s.stream if disconnect else True)


def test_even_a_small_pool_has_every_kind_and_a_tiny_one_is_refused() -> None:
    assert {s.kind for s in build_pool(6, 0, mix_shape(256), words)} == {k for k, _ in KIND_SHARES}
    with pytest.raises(InvalidArgument):
        build_pool(5, 0, mix_shape(256), words)


def test_a_conversation_turn_carries_every_earlier_message_and_answer() -> None:
    conv = spec(("one", "two", "three"), (1, 1, 1), stream=True)
    body = conv.body("tiny", 2, ("A1", "A2"))
    assert [m["content"] for m in body["messages"]] == ["one", "A1", "two", "A2", "three"]
    assert [m["role"] for m in body["messages"]] == ["user", "assistant", "user", "assistant", "user"]
    assert body["stream_options"] == {"include_usage": True} and body["seed"] == 7
    with pytest.raises(InvalidArgument):
        conv.body("tiny", 2, ("A1",))


def test_a_body_is_what_the_reference_gets_too() -> None:
    body = spec(n=3).body("tiny", 0, ())
    assert body == {
        "model": "tiny",
        "messages": [{"role": "user", "content": "hello there"}],
        "max_tokens": 8,
        "n": 3,
        "seed": 7,
        "temperature": 0.8,
        "stream": False,
    }


def test_shapes_count_each_choice_and_each_turn_with_the_history() -> None:
    t = TEMPLATE_TOKENS_PER_MESSAGE
    assert [(s.prompt, s.output) for s in request_shapes(spec(n=2))] == [(3 + t, 8), (3 + t, 8)]
    conv = spec(("a", "b"), (4, 6), max_tokens=10)
    assert [(s.prompt, s.output) for s in request_shapes(conv)] == [(4 + t, 10), (4 + 10 + 6 + 3 * t, 10)]


def test_the_small_mix_fits_the_tiny_lane_context() -> None:
    shape = mix_shape(256)
    longest = shape.long_prompt[1] + shape.output[1] + TEMPLATE_TOKENS_PER_MESSAGE
    conversation = 3 * (shape.turn_prompt[1] + shape.turn_output[1]) + 5 * TEMPLATE_TOKENS_PER_MESSAGE
    assert longest <= 256 and conversation <= 256
    assert mix_shape(5120).long_prompt[1] > 256
