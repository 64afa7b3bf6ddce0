"""`AnswerMemory`: an LRU of (package hash, answer text) -> token ids, bounded by the ids it holds
in total; a bound of 0 disables it."""

from __future__ import annotations

import pytest

from calculet.common.errors import InvalidArgument
from calculet.gateway.text.answer_memory import DEFAULT_MAX_TOKENS, AnswerMemory


def test_remembers_and_recalls_the_ids_of_a_text() -> None:
    memory = AnswerMemory(100)
    assert memory.recall("pkg", "Hello.") is None
    assert memory.remember("pkg", "Hello.", [9, 8, 7])
    assert list(memory.recall("pkg", "Hello.") or []) == [9, 8, 7]
    assert (memory.tokens, memory.entries) == (3, 1)


def test_the_key_includes_the_package() -> None:
    memory = AnswerMemory(100)
    memory.remember("pkg-a", "Hello.", [1, 2])
    assert memory.recall("pkg-b", "Hello.") is None
    memory.remember("pkg-b", "Hello.", [3])
    assert list(memory.recall("pkg-a", "Hello.") or []) == [1, 2]
    assert list(memory.recall("pkg-b", "Hello.") or []) == [3]
    assert (memory.tokens, memory.entries) == (3, 2)


def test_the_key_is_the_exact_text() -> None:
    memory = AnswerMemory(100)
    memory.remember("pkg", "Hello.", [1, 2])
    for other in ("Hello", "Hello. ", "hello.", " Hello."):
        assert memory.recall("pkg", other) is None


def test_the_bound_counts_tokens_and_evicts_the_least_recently_used() -> None:
    memory = AnswerMemory(10)
    memory.remember("pkg", "a", [1] * 4)
    memory.remember("pkg", "b", [2] * 4)
    assert memory.recall("pkg", "a") is not None  # "a" is now newer than "b"
    memory.remember("pkg", "c", [3] * 4)  # 12 > 10: the oldest, "b", goes
    assert memory.recall("pkg", "b") is None
    assert memory.recall("pkg", "a") is not None and memory.recall("pkg", "c") is not None
    assert (memory.tokens, memory.entries) == (8, 2)
    memory.remember("pkg", "d", [4] * 10)  # exactly the bound: everything older goes
    assert (memory.tokens, memory.entries) == (10, 1)
    assert memory.recall("pkg", "a") is None and memory.recall("pkg", "c") is None


def test_remembering_a_text_again_replaces_its_ids_and_makes_it_newest() -> None:
    memory = AnswerMemory(10)
    memory.remember("pkg", "a", [1] * 4)
    memory.remember("pkg", "b", [2] * 4)
    memory.remember("pkg", "a", [5] * 2)
    assert (memory.tokens, memory.entries) == (6, 2)
    assert list(memory.recall("pkg", "a") or []) == [5, 5]
    memory.remember("pkg", "c", [3] * 5)  # 11 > 10: "b" is the oldest now
    assert memory.recall("pkg", "b") is None and memory.recall("pkg", "a") is not None


def test_an_answer_longer_than_the_bound_is_not_kept_and_evicts_nothing() -> None:
    memory = AnswerMemory(10)
    memory.remember("pkg", "a", [1] * 4)
    assert not memory.remember("pkg", "long", [2] * 11)
    assert memory.recall("pkg", "long") is None
    assert (memory.tokens, memory.entries) == (4, 1)


def test_empty_texts_and_empty_ids_are_not_kept() -> None:
    memory = AnswerMemory(10)
    assert not memory.remember("pkg", "", [1, 2])
    assert not memory.remember("pkg", "a", [])
    assert (memory.tokens, memory.entries) == (0, 0)


def test_zero_disables_it() -> None:
    memory = AnswerMemory(0)
    assert not memory.enabled
    assert not memory.remember("pkg", "Hello.", [1])
    assert memory.recall("pkg", "Hello.") is None
    assert (memory.tokens, memory.entries) == (0, 0)


def test_ids_are_stored_compactly_and_must_be_token_ids() -> None:
    memory = AnswerMemory(10)
    memory.remember("pkg", "a", [0, 2**32 - 1])
    stored = memory.recall("pkg", "a")
    assert stored is not None and stored.itemsize == 4  # type: ignore[attr-defined]
    with pytest.raises(OverflowError):
        memory.remember("pkg", "b", [-1])
    assert memory.recall("pkg", "b") is None


def test_a_negative_bound_is_refused_and_the_default_is_off() -> None:
    with pytest.raises(InvalidArgument, match="answer-memory-tokens"):
        AnswerMemory(-1)
    default = AnswerMemory()
    assert not default.enabled and default.max_tokens == DEFAULT_MAX_TOKENS == 0, "opt-in: a gateway stays stateless"
    default.remember("pkg", "a", [1, 2])
    assert default.recall("pkg", "a") is None
