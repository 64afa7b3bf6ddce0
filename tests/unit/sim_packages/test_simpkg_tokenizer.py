"""The shipped tokenizer and chat template: round trips, special ids as declared, ChatML rendering."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from calculet.common.errors import InvalidArgument
from calculet.daemon.package.manifest import load_manifest
from calculet.ops.sim_packages import PRESETS
from calculet.ops.sim_packages.chat_template import load_chat_template, render_chat
from calculet.ops.sim_packages.tokenizer import TrainedTokenizer, tokenizer_json, train_tokenizer

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


@pytest.fixture(scope="module")
def trained() -> TrainedTokenizer:
    return train_tokenizer()


@functools.cache  # a package's file is read once (Qwen3's is 5 MB): the tests only encode and look up
def _shipped(pkg: Path) -> Tokenizer:
    return Tokenizer.from_file(str(pkg / load_manifest(pkg).tokenizer.path))


def _template_resource(pkg: Path) -> str:
    """The chat template file of the preset that built `pkg`."""
    name = load_manifest(pkg).name
    return next(p.chat_template_resource for p in PRESETS.values() if p.package_name == name)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200))
def test_round_trips_any_text(trained: TrainedTokenizer, text: str) -> None:
    ids = trained.encode(text)
    assert all(0 <= i < trained.vocab_size for i in ids)
    assert trained.decode(ids) == text


def test_shipped_file_round_trips_and_compresses(any_pkg: Path) -> None:
    tok = _shipped(any_pkg)
    text = "Hello! How can I help you today? The quick brown fox jumps over the lazy dog."
    ids = tok.encode(text).ids
    assert tok.decode(ids) == text
    assert len(ids) < len(text.encode()) / 2  # merges were learned from the corpus


def test_special_tokens_have_the_declared_ids(any_pkg: Path) -> None:
    m = load_manifest(any_pkg)
    tok = _shipped(any_pkg)
    ids = {s: tok.token_to_id(s) for s in SPECIALS}
    assert m.tokenizer.eos_token_ids == (ids["<|im_end|>"], ids["<|endoftext|>"])
    assert m.tokenizer.pad_token_id == ids["<|endoftext|>"]
    # A special token in text encodes to exactly its id, not to its bytes.
    enc = tok.encode("<|im_start|>user\nhi<|im_end|>").ids
    assert enc[0] == ids["<|im_start|>"] and enc[-1] == ids["<|im_end|>"]
    config = json.loads((any_pkg / "tokenizer" / "tokenizer_config.json").read_text())
    assert config["eos_token"] == "<|im_end|>"
    # The config lists exactly the tokenizer's added tokens (tiny: these three; qwen: Qwen3's 26).
    added = {i: t.content for i, t in tok.get_added_tokens_decoder().items()}
    assert {int(k): v["content"] for k, v in config["added_tokens_decoder"].items()} == added
    assert {i: s for s, i in ids.items()}.items() <= added.items()
    if m.name == PRESETS["tiny"].package_name:
        assert len(added) == len(SPECIALS)
    assert config["model_max_length"] == m.tokenizer.model_max_length


def test_vocab_size(tiny_pkg: Path) -> None:
    tok = _shipped(tiny_pkg)
    n = tok.get_vocab_size(with_added_tokens=True)
    assert 400 <= n <= 512
    vocab = load_manifest(tiny_pkg).architecture.vocab_size
    assert vocab % 2 == 0 and n <= vocab <= n + 1


def test_training_is_deterministic(trained: TrainedTokenizer) -> None:
    assert tokenizer_json(train_tokenizer()) == tokenizer_json(trained)


def test_ids_beyond_the_tokenizer_decode_to_nothing(trained: TrainedTokenizer) -> None:
    hello = trained.encode("hello")
    assert trained.decode([*hello, trained.vocab_size, 151_935]) == "hello"


def test_chat_template_renders_chatml_with_generation_prompt(any_pkg: Path) -> None:
    template = (any_pkg / load_manifest(any_pkg).tokenizer.chat_template).read_text()
    assert template == load_chat_template(_template_resource(any_pkg))
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    text = render_chat(template, messages, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"
    )
    without = render_chat(template, messages, add_generation_prompt=False)
    assert text.startswith(without) and not without.endswith("assistant\n")
    ids = _shipped(any_pkg).encode(text).ids
    im_start = _shipped(any_pkg).token_to_id("<|im_start|>")
    assert ids.count(im_start) == 3


def test_chat_template_rejects_malformed_messages() -> None:
    with pytest.raises(InvalidArgument, match=r"messages\[1\]"):
        render_chat(
            load_chat_template(),
            [{"role": "user", "content": "a"}, {"role": "user"}],
            add_generation_prompt=True,
        )


def test_chat_template_render_errors_are_typed() -> None:
    with pytest.raises(InvalidArgument, match="failed to render"):
        render_chat("{{ messages[0].nope() }}", [{"role": "user", "content": "a"}], add_generation_prompt=False)
