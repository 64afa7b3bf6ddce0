"""tiktoken ranks -> HF byte-level BPE: parsing, the byte alphabet, merge derivation, and equality
with tiktoken on small vocabularies (a trained one and hand-made orderings)."""

from __future__ import annotations

import base64
import itertools
import random
from collections import Counter

import pytest
import tiktoken
from tokenizers import Regex, Tokenizer, decoders, pre_tokenizers

from calculet.ops.sim_packages.corpus import CORPUS
from calculet.ops.sim_packages.tiktoken_bpe import (
    byte_level_alphabet,
    byte_level_bpe,
    derive_merges,
    parse_tiktoken_ranks,
    split_token,
)

PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
BYTES = {bytes([b]): b for b in range(256)}


def _file(ranks: dict[bytes, int]) -> bytes:
    return b"".join(base64.b64encode(t) + b" " + str(r).encode() + b"\n" for t, r in ranks.items())


def _with(*tokens: bytes) -> dict[bytes, int]:
    """The 256 bytes, then `tokens` at ranks 256, 257, ..."""
    return BYTES | {t: 256 + i for i, t in enumerate(tokens)}


def _hf(ranks: dict[bytes, int]) -> Tokenizer:
    tok = Tokenizer(byte_level_bpe(ranks))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PATTERN), "isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    return tok


def _tiktoken(ranks: dict[bytes, int]) -> tiktoken.Encoding:
    return tiktoken.Encoding("toy", pat_str=PATTERN, mergeable_ranks=ranks, special_tokens={})


def _train(texts: list[str], merges: int) -> dict[bytes, int]:
    """A plain BPE trainer (most frequent adjacent pair first, ties by bytes) over whitespace words."""
    words = Counter(tuple(bytes([b]) for b in w.encode()) for t in texts for w in t.split(" "))
    ranks = dict(BYTES)
    for _ in range(merges):
        pairs: Counter[tuple[bytes, bytes]] = Counter()
        for w, n in words.items():
            for p in itertools.pairwise(w):
                pairs[p] += n
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        ranks.setdefault(best[0] + best[1], len(ranks))
        merged: Counter[tuple[bytes, ...]] = Counter()
        for w, n in words.items():
            out: list[bytes] = []
            for piece in w:
                if out and (out[-1], piece) == best:
                    out[-1] += piece
                else:
                    out.append(piece)
            merged[tuple(out)] += n
        words = merged
    return ranks


def test_alphabet_is_the_byte_level_pre_tokenizers() -> None:
    table = byte_level_alphabet()
    assert len(table) == 256 and set(table) == set(pre_tokenizers.ByteLevel.alphabet())
    assert (table[ord(" ")], table[ord("\n")], table[ord("a")]) == ("Ġ", "Ċ", "a")
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    # One character per UTF-8 length class covers every byte value UTF-8 can hold.
    for ch in ("a", "\x00", "é", "ÿ", "߿", "中", "\uffff", "😀", "\U0010ffff"):
        assert byte_level.pre_tokenize_str(ch)[0][0] == "".join(table[b] for b in ch.encode())


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b"YQ== 0\nYg==\n", "line 2"),
        (b"!!! 0\n", "line 1"),
        (b"YQ== x\n", "line 1"),
        (_file(BYTES) + base64.b64encode(b"a") + b" 256\n", "repeated"),
        (_file(BYTES | {b"ab": 300}), "0..n-1"),
        (_file({t: r for t, r in BYTES.items() if r != 255} | {b"ab": 255}), "single bytes"),
    ],
)
def test_malformed_ranks_are_refused(data: bytes, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        parse_tiktoken_ranks(data)


def test_ranks_parse_in_file_order() -> None:
    ranks = _with(b"ab", b"abc")
    assert parse_tiktoken_ranks(_file(ranks)) == ranks


def test_split_is_what_tiktoken_does_below_the_tokens_rank() -> None:
    # "bc" ranks below "ab": tiktoken makes "abc" as a + bc, not ab + c.
    ranks = _with(b"bc", b"ab", b"abc")
    assert split_token(b"abc", ranks) == (b"a", b"bc")
    assert derive_merges(ranks) == [(b"b", b"c"), (b"a", b"b"), (b"a", b"bc")]
    assert _hf(ranks).encode("abc abcab").ids == _tiktoken(ranks).encode("abc abcab")


def test_equal_ranks_merge_leftmost_first() -> None:
    ranks = _with(b"aa", b"aaa")
    assert split_token(b"aaa", ranks) == (b"aa", b"a")
    for text in ("aaa", "aaaa", "aaaaa", "aaaaaaa"):
        assert _hf(ranks).encode(text).ids == _tiktoken(ranks).encode(text)


def test_a_token_bpe_cannot_reach_is_refused() -> None:
    # "abc" ranks below both of its possible halves: tiktoken's merges never produce it.
    ranks = _with(b"abc", b"ab", b"bc")
    assert split_token(b"abc", ranks) is None
    with pytest.raises(ValueError, match="unreachable"):
        derive_merges(ranks)


def test_trained_vocabulary_encodes_like_tiktoken() -> None:
    ranks = _train(list(CORPUS), 300)
    hf, tt = _hf(ranks), _tiktoken(ranks)
    rng = random.Random(7)
    words = " ".join(CORPUS).split()
    texts = [" ".join(rng.choices(words, k=rng.randint(1, 30))) for _ in range(300)]
    alphabet = [*sorted(set("".join(CORPUS))), "  ", "\n", "é", "中"]
    texts += ["".join(rng.choices(alphabet, k=rng.randint(1, 40))) for _ in range(300)]
    for text, enc in zip(texts, hf.encode_batch(texts), strict=True):
        assert enc.ids == tt.encode(text), text
        assert hf.decode(enc.ids) == text
