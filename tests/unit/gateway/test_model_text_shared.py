"""Packages that ship the same tokenizer.json share one Tokenizer in the gateway (a Qwen3 tokenizer
is some 70 MB); a different file gets its own, and a broken one is refused as before."""

from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from calculet.common.errors import FailedPrecondition
from calculet.gateway.text.model_text import ModelFacts, ModelText


def _tokenizer_json(words: list[str]) -> bytes:
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token=words[0]))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return tok.to_str().encode("utf-8")


def _facts(alias: str, package_hash: str) -> ModelFacts:
    return ModelFacts(
        alias=alias, package_hash=package_hash, vocab_size=8, context=64, eos_token_ids=(1,), bos_token_id=None
    )


def test_packages_with_one_tokenizer_file_share_it_and_others_do_not() -> None:
    same = _tokenizer_json(["<unk>", "</s>", "hello", "world"])
    a, b = ModelText(_facts("a", "pa"), same, ""), ModelText(_facts("b", "pb"), same, "")
    other = ModelText(_facts("c", "pc"), _tokenizer_json(["<unk>", "</s>", "world", "hello"]), "")
    assert a.tokenizer is b.tokenizer and other.tokenizer is not a.tokenizer
    assert a.encode("hello world") == b.encode("hello world") == [2, 3] and other.encode("hello world") == [3, 2]


def test_a_tokenizer_that_does_not_load_is_still_refused_for_its_package() -> None:
    broken = json.dumps({"version": "1.0", "model": {"type": "Nonsense"}}).encode()
    with pytest.raises(FailedPrecondition, match=r"'x': its tokenizer\.json does not load"):
        ModelText(_facts("x", "px"), broken, "")
