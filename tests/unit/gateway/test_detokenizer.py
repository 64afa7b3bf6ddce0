"""`Detokenizer`: incremental text from token ids, never half a character, on the tiny package's real
byte-level BPE tokenizer. The oracle is the tokenizer's own one-shot `decode` of the whole list (or
the original text), never the detokenizer's earlier output."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from calculet.gateway.text.detokenizer import Detokenizer
from calculet.ops.sim_packages.build import build_sim_package

FFFD = "\ufffd"
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
MULTIBYTE_TEXTS = (
    "你好，世界！今天天气很好。",
    "Grüße aus Köln: café, naïve, résumé, Ångström, ñandú.",
    "Combining: e\u0301 a\u0308 o\u0302 n\u0303.",
    "Family 👨‍👩‍👧‍👦, coder 👩‍💻, flag 🏳️‍🌈, skin tone 👍🏽, 😀😃.",
    "mixed: 日本語 and 한국어 and العربية and 🚀 at the end 🎉",
    "x" * 3 + "€" * 5 + "𝄞" * 2,
)


def _byte_chars() -> dict[int, str]:
    """GPT-2's byte -> printable character map (what the ByteLevel pre-tokenizer writes)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    pkg = build_sim_package("tiny", tmp_path_factory.mktemp("detok") / "tiny")
    return Tokenizer.from_file(str(Path(pkg) / "tokenizer" / "tokenizer.json"))


@pytest.fixture(scope="module")
def size(tokenizer: Tokenizer) -> int:
    return tokenizer.get_vocab_size(with_added_tokens=True)


@pytest.fixture(scope="module")
def special_ids(tokenizer: Tokenizer) -> list[int]:
    ids = [tokenizer.token_to_id(s) for s in SPECIALS]
    assert all(i is not None for i in ids)
    return ids


@pytest.fixture(scope="module")
def byte_ids(tokenizer: Tokenizer) -> dict[int, int]:
    """byte value -> the id of the token that is exactly that byte (all 256 are in the alphabet)."""
    ids = {b: tokenizer.token_to_id(ch) for b, ch in _byte_chars().items()}
    assert None not in ids.values()
    return ids  # type: ignore[return-value]


def _feed(detok: Detokenizer, chunks: list[list[int]]) -> list[str]:
    return [detok.add(chunk) for chunk in chunks]


def _split(items: list[int], cuts: list[int]) -> list[list[int]]:
    bounds = [0, *sorted(c % (len(items) + 1) for c in cuts), len(items)]
    return [items[a:b] for a, b in itertools.pairwise(bounds)]


# (a) real multi-byte text -------------------------------------------------------------------


@pytest.mark.parametrize("text", MULTIBYTE_TEXTS)
def test_multibyte_text_one_token_at_a_time(tokenizer: Tokenizer, size: int, text: str) -> None:
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    assert len(ids) > 1
    detok = Detokenizer(tokenizer, size)
    deltas = _feed(detok, [[t] for t in ids])
    assert not any(FFFD in d for d in deltas), deltas
    assert "".join(deltas) + detok.flush() == text


@pytest.mark.parametrize("text", MULTIBYTE_TEXTS)
def test_multibyte_text_one_byte_token_at_a_time(byte_ids: dict[int, int], size: int, tokenizer: Tokenizer, text: str):
    """The worst split: every UTF-8 byte its own token; each delta is whole characters."""
    detok = Detokenizer(tokenizer, size)
    deltas = _feed(detok, [[byte_ids[b]] for b in text.encode("utf-8")])
    assert not any(FFFD in d for d in deltas)
    assert "".join(deltas) + detok.flush() == text
    # A character of n bytes yields nothing for its first n - 1 bytes, then the whole character.
    assert sum(1 for d in deltas if d == "") == len(text.encode("utf-8")) - len(text)


@settings(max_examples=60, deadline=None)
@given(text=st.text(max_size=40), cuts=st.lists(st.integers(0, 10_000), max_size=12))
def test_any_valid_text_split_anywhere_round_trips(
    tokenizer: Tokenizer, size: int, byte_ids: dict[int, int], text: str, cuts: list[int]
) -> None:
    if FFFD in text:
        return  # U+FFFD in the input is legitimately emitted; the claim is about ours
    ids = [byte_ids[b] for b in text.encode("utf-8")]
    detok = Detokenizer(tokenizer, size)
    deltas = _feed(detok, _split(ids, cuts))
    assert not any(FFFD in d for d in deltas)
    assert "".join(deltas) + detok.flush() == text


# (b) arbitrary ids, arbitrary chunks ---------------------------------------------------------


@st.composite
def _id_lists(draw: st.DrawFn, size: int, special_ids: list[int], byte_ids: dict[int, int]) -> list[int]:
    lead_and_continuation = [byte_ids[b] for b in (0x80, 0xA0, 0xBD, 0xBF, 0xC3, 0xE4, 0xE2, 0xF0, 0x9F, 0xFF)]
    one = st.one_of(
        st.integers(0, size - 1),  # any real token, multi-byte merges included
        st.integers(size, size + 64),  # padding ids past the tokenizer: nothing
        st.sampled_from(special_ids),  # not rendered
        st.sampled_from(lead_and_continuation),  # bytes that make (or break) UTF-8 sequences
        st.sampled_from([byte_ids[b] for b in "a é€😀".encode()]),
    )
    return draw(st.lists(one, max_size=40))


@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_random_ids_match_one_shot_decode(
    tokenizer: Tokenizer, size: int, special_ids: list[int], byte_ids: dict[int, int], data: st.DataObject
) -> None:
    ids = data.draw(_id_lists(size, special_ids, byte_ids), label="ids")
    cuts = data.draw(st.lists(st.integers(0, 10_000), max_size=15), label="cuts")
    detok = Detokenizer(tokenizer, size)
    deltas = _feed(detok, _split(ids, cuts))
    tail = detok.flush()
    expected = tokenizer.decode([t for t in ids if t < size], skip_special_tokens=True)
    assert "".join(deltas) + tail == expected
    assert not any(d.endswith(FFFD) for d in deltas), deltas
    for special in SPECIALS:
        assert special not in "".join(deltas) + tail


def test_ids_past_the_tokenizer_and_specials_decode_to_nothing(
    tokenizer: Tokenizer, size: int, special_ids: list[int]
) -> None:
    detok = Detokenizer(tokenizer, size)
    assert detok.add([size, size + 1, 10**9, 2**32 + 1, *special_ids]) == ""
    assert detok.add(tokenizer.encode("hi", add_special_tokens=False).ids) == "hi"
    assert detok.add([special_ids[2], size + 5]) == ""
    assert detok.flush() == ""


# (c) an incomplete character at the very end ------------------------------------------------


@pytest.mark.parametrize("char", ["你", "😀", "é", "€"])
def test_incomplete_character_is_held_until_flush(
    tokenizer: Tokenizer, size: int, byte_ids: dict[int, int], char: str
) -> None:
    encoded = char.encode("utf-8")
    partial = encoded[:-1]
    detok = Detokenizer(tokenizer, size)
    assert detok.add(tokenizer.encode("ok ", add_special_tokens=False).ids) == "ok "
    for b in partial:
        assert detok.add([byte_ids[b]]) == ""
    assert detok.flush() == partial.decode("utf-8", errors="replace") == FFFD
    assert detok.flush() == ""


def test_invalid_byte_is_emitted_once_a_later_token_shows_it_will_not_complete(
    tokenizer: Tokenizer, size: int, byte_ids: dict[int, int]
) -> None:
    raw = b"\xe4\xbdA"  # a 3-byte lead and one continuation, then ASCII
    detok = Detokenizer(tokenizer, size)
    assert detok.add([byte_ids[0xE4]]) == ""
    assert detok.add([byte_ids[0xBD]]) == ""
    assert detok.add([byte_ids[ord("A")]]) == raw.decode("utf-8", errors="replace")
    assert detok.flush() == ""


class CountingTokenizer:
    """The real tokenizer, counting `decode` calls."""

    def __init__(self, inner: Tokenizer) -> None:
        self.inner = inner
        self.decodes = 0

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        self.decodes += 1
        return self.inner.decode(ids, skip_special_tokens=skip_special_tokens)


def test_a_long_ascii_stream_costs_one_decode_per_token(tokenizer: Tokenizer, size: int) -> None:
    text = "the quick brown fox jumps over the lazy dog, " * 8
    ids = tokenizer.encode(text).ids
    counting = CountingTokenizer(tokenizer)
    detok = Detokenizer(counting, size)  # type: ignore[arg-type]  # duck-typed: decode only
    out = "".join(detok.add([t]) for t in ids) + detok.flush()
    assert out == tokenizer.decode(ids, skip_special_tokens=True)
    assert len(ids) > 4 * 6  # the window moved several times
    assert counting.decodes <= len(ids) + len(ids) // 6 + 1  # the window's jumps cost one decode more each
