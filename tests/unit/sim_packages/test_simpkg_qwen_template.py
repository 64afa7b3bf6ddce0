"""The qwen package's chat template (ChatML, Qwen3 conventions) and its tokenizer files: EOS ids,
tokenizer_config, the golden prompt through template and tokenizer, validation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment, SandboxedEnvironment
from tokenizers import Tokenizer

from calculet.daemon.package.manifest import load_manifest
from calculet.daemon.package.report import Severity
from calculet.daemon.package.validate import validate_package
from calculet.ops.sim_packages.chat_template import QWEN_TEMPLATE_RESOURCE, load_chat_template, render_chat
from calculet.ops.sim_packages.golden import GOLDEN_MESSAGES

SYSTEM_USER = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi!\nTwo lines."}]
EXPECTED = "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi!\nTwo lines.<|im_end|>\n"
# The golden prompt as Qwen3's tokenizer encodes it: <|im_start|> user \n Hello ! ␣How ␣can ␣I ␣help
# ␣you ␣today ? <|im_end|> \n <|im_start|> assistant \n
GOLDEN_IDS = (151644, 872, 198, 9707, 0, 2585, 646, 358, 1492, 498, 3351, 30, 151645, 198, 151644, 77091, 198)


def _environments() -> list[SandboxedEnvironment]:
    # Jinja2's defaults, and the gateway's settings (ImmutableSandboxedEnvironment, trim/lstrip blocks).
    return [SandboxedEnvironment(), ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)]


def _render(messages: list[dict[str, Any]], add_generation_prompt: bool) -> list[str]:
    template = load_chat_template(QWEN_TEMPLATE_RESOURCE)
    return [
        env.from_string(template).render(
            messages=messages, add_generation_prompt=add_generation_prompt, bos_token="", eos_token="<|im_end|>"
        )
        for env in _environments()
    ]


@pytest.mark.parametrize("add_generation_prompt", [False, True])
def test_system_and_user_render_as_chatml(add_generation_prompt: bool) -> None:
    expected = EXPECTED + ("<|im_start|>assistant\n" if add_generation_prompt else "")
    assert _render(SYSTEM_USER, add_generation_prompt) == [expected, expected]
    assert render_chat(load_chat_template(QWEN_TEMPLATE_RESOURCE), SYSTEM_USER, add_generation_prompt=True) == (
        EXPECTED + "<|im_start|>assistant\n"
    )


def test_content_parts_are_joined_and_null_content_is_empty() -> None:
    messages: list[dict[str, Any]] = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Describe "},
                {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
                {"type": "text", "text": "this."},
            ],
        },
        {"role": "assistant", "content": None},
        {"role": "user", "content": []},
    ]
    expected = (
        "<|im_start|>user\nDescribe this.<|im_end|>\n<|im_start|>assistant\n<|im_end|>\n"
        "<|im_start|>user\n<|im_end|>\n<|im_start|>assistant\n"
    )
    assert _render(messages, True) == [expected, expected]


def test_a_multi_turn_conversation_keeps_every_turn() -> None:
    messages = [*SYSTEM_USER, {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye"}]
    expected = EXPECTED + "<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n"
    assert _render(messages, False) == [expected, expected]


def test_the_package_ships_the_qwen_template_and_tokenizer_files(qwen_pkg: Path) -> None:
    m = load_manifest(qwen_pkg)
    assert (qwen_pkg / m.tokenizer.chat_template).read_text() == load_chat_template(QWEN_TEMPLATE_RESOURCE)
    assert m.tokenizer.eos_token_ids == (151_645, 151_643)  # Qwen3's generation_config: <|im_end|>, <|endoftext|>
    assert (m.tokenizer.pad_token_id, m.tokenizer.bos_token_id) == (151_643, None)
    assert m.tokenizer.model_max_length == 131_072
    config = json.loads((qwen_pkg / "tokenizer" / "tokenizer_config.json").read_text())
    assert (config["eos_token"], config["pad_token"], config["bos_token"]) == ("<|im_end|>", "<|endoftext|>", None)
    assert (config["add_bos_token"], config["model_max_length"]) == (False, 131_072)
    added = config["added_tokens_decoder"]
    assert sorted(int(k) for k in added) == list(range(151_643, 151_669))
    assert (added["151645"]["content"], added["151645"]["special"]) == ("<|im_end|>", True)
    assert (added["151667"]["content"], added["151667"]["special"]) == ("<think>", False)
    assert config["additional_special_tokens"][:2] == ["<|im_start|>", "<|im_end|>"]
    tok = Tokenizer.from_file(str(qwen_pkg / m.tokenizer.path))
    assert [tok.id_to_token(i) for i in m.tokenizer.eos_token_ids] == ["<|im_end|>", "<|endoftext|>"]
    assert m.architecture.vocab_size == 151_936 > tok.get_vocab_size(with_added_tokens=True) == 151_669


def test_the_golden_prompt_goes_through_template_and_tokenizer(qwen_pkg: Path) -> None:
    m = load_manifest(qwen_pkg)
    text = render_chat(load_chat_template(QWEN_TEMPLATE_RESOURCE), GOLDEN_MESSAGES, add_generation_prompt=True)
    assert text == "<|im_start|>user\nHello! How can I help you today?<|im_end|>\n<|im_start|>assistant\n"
    tok = Tokenizer.from_file(str(qwen_pkg / m.tokenizer.path))
    assert m.golden.prompt_tokens == tuple(tok.encode(text, add_special_tokens=False).ids) == GOLDEN_IDS
    assert len(m.golden.decode_tokens) == 9 and all(0 <= t < 151_936 for t in m.golden.decode_tokens)


def test_the_qwen_package_validates(qwen_pkg: Path) -> None:
    report = validate_package(qwen_pkg)
    assert report.ok, [p for p in report.problems if p.severity is Severity.ERROR]
    # The only finding: the real model_max_length (131,072) clamped to the lane context.
    assert [p.code for p in report.problems] == ["tokenizer.max_length_clamped"]
