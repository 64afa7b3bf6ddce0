"""`ModelText`: the tiny package's real tokenizer.json and ChatML template, rendered in a sandbox."""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import Tokenizer

from calculet.common.errors import FailedPrecondition, InvalidArgument
from calculet.gateway.text.model_text import ModelFacts, ModelText
from calculet.ops.sim_packages.build import build_sim_package


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return Path(build_sim_package("tiny", tmp_path_factory.mktemp("model_text") / "tiny"))


@pytest.fixture(scope="module")
def tokenizer_json(package: Path) -> bytes:
    return (package / "tokenizer" / "tokenizer.json").read_bytes()


@pytest.fixture(scope="module")
def template(package: Path) -> str:
    return (package / "tokenizer" / "chat_template.jinja").read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def reference(tokenizer_json: bytes) -> Tokenizer:
    """An independent load of the same tokenizer, to derive expected ids."""
    return Tokenizer.from_str(tokenizer_json.decode("utf-8"))


@pytest.fixture(scope="module")
def facts(reference: Tokenizer) -> ModelFacts:
    size = reference.get_vocab_size(with_added_tokens=True)
    return ModelFacts(
        alias="tiny",
        package_hash="0" * 64,
        vocab_size=size + 64,  # the model's vocab is padded past the tokenizer's
        context=256,
        eos_token_ids=(reference.token_to_id("<|im_end|>"), reference.token_to_id("<|endoftext|>")),
    )


@pytest.fixture(scope="module")
def text(facts: ModelFacts, tokenizer_json: bytes, template: str) -> ModelText:
    return ModelText(facts, tokenizer_json, template)


MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Hi there! 你好"},
    {"role": "assistant", "content": "Hello."},
    {"role": "user", "content": "Bye\nnow"},
]
CHATML = (
    "<|im_start|>system\nYou are terse.<|im_end|>\n"
    "<|im_start|>user\nHi there! 你好<|im_end|>\n"
    "<|im_start|>assistant\nHello.<|im_end|>\n"
    "<|im_start|>user\nBye\nnow<|im_end|>\n"
)


def test_render_chat_is_chatml(text: ModelText) -> None:
    assert text.has_chat_template
    assert text.render_chat(MESSAGES) == CHATML + "<|im_start|>assistant\n"
    assert text.render_chat(MESSAGES, add_generation_prompt=True) == CHATML + "<|im_start|>assistant\n"
    assert text.render_chat(MESSAGES, add_generation_prompt=False) == CHATML


def test_render_chat_empty_content(text: ModelText) -> None:
    rendered = text.render_chat([{"role": "user", "content": ""}], add_generation_prompt=False)
    assert rendered == "<|im_start|>user\n<|im_end|>\n"


def test_encode_recognises_special_tokens(text: ModelText, reference: Tokenizer) -> None:
    im_end = reference.token_to_id("<|im_end|>")
    im_start = reference.token_to_id("<|im_start|>")
    ids = text.encode("ab<|im_end|>cd")
    assert ids.count(im_end) == 1
    i = ids.index(im_end)
    assert reference.decode(ids[:i]) == "ab" and reference.decode(ids[i + 1 :]) == "cd"
    prompt = text.encode(text.render_chat(MESSAGES))
    assert prompt.count(im_start) == len(MESSAGES) + 1 and prompt.count(im_end) == len(MESSAGES)
    assert prompt[0] == im_start  # no BOS added
    assert reference.decode(prompt, skip_special_tokens=False) == CHATML + "<|im_start|>assistant\n"


def test_tokenizer_facts(text: ModelText, reference: Tokenizer) -> None:
    assert text.tokenizer_size == reference.get_vocab_size(with_added_tokens=True)
    assert text.eos_token == "<|im_end|>"
    assert text.bos_token == ""


def test_token_text(text: ModelText, reference: Tokenizer, facts: ModelFacts) -> None:
    size = text.tokenizer_size
    assert text.token_text(size) == ""
    assert text.token_text(facts.vocab_size - 1) == ""
    assert text.token_text(reference.token_to_id("<|im_end|>")) == "<|im_end|>"
    hello = reference.encode("hello", add_special_tokens=False).ids
    assert "".join(text.token_text(t) for t in hello) == "hello"


def test_template_sees_bos_and_eos(facts: ModelFacts, tokenizer_json: bytes, reference: Tokenizer) -> None:
    with_bos = ModelFacts(**{**facts.__dict__, "bos_token_id": reference.token_to_id("<|endoftext|>")})
    t = ModelText(with_bos, tokenizer_json, "{{ bos_token }}|{{ eos_token }}")
    assert t.render_chat([]) == "<|endoftext|>|<|im_end|>"


@pytest.mark.parametrize(
    "source",
    [
        "{{ messages.__class__.__mro__ }}",
        "{{ ''.__class__.__subclasses__() }}",
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ raise_exception.__globals__['__builtins__'] }}",
        "{% for m in messages %}{{ m.__class__.__init__.__globals__ }}{% endfor %}",
        "{{ messages.append({'role': 'x'}) }}",  # immutable sandbox: no mutation of the messages
        "{{ messages[0].update({'role': 'x'}) }}",
    ],
)
def test_template_cannot_reach_python_internals(facts: ModelFacts, tokenizer_json: bytes, source: str) -> None:
    messages = [{"role": "user", "content": "hi"}]
    t = ModelText(facts, tokenizer_json, source)
    with pytest.raises(InvalidArgument):
        t.render_chat(messages)
    assert messages == [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    "source", ["[{{ messages.__class__ }}]", "[{{ raise_exception.__globals__ }}]", "[{{ ''.__class__ }}]"]
)
def test_unsafe_attribute_alone_renders_nothing(facts: ModelFacts, tokenizer_json: bytes, source: str) -> None:
    # A bare unsafe attribute is undefined (empty) or refused, never the object behind it.
    t = ModelText(facts, tokenizer_json, source)
    try:
        rendered = t.render_chat([{"role": "user", "content": "hi"}])
    except InvalidArgument:
        return
    assert rendered == "[]"


def test_raise_exception_is_invalid_argument(facts: ModelFacts, tokenizer_json: bytes) -> None:
    source = "{% if messages[0]['role'] != 'system' %}{{ raise_exception('system message first, please') }}{% endif %}"
    t = ModelText(facts, tokenizer_json, source)
    with pytest.raises(InvalidArgument, match="system message first, please"):
        t.render_chat([{"role": "user", "content": "hi"}])
    assert t.render_chat([{"role": "system", "content": "x"}]) == ""


def test_template_errors_at_render_are_invalid_argument(facts: ModelFacts, tokenizer_json: bytes) -> None:
    t = ModelText(facts, tokenizer_json, "{{ messages[0]['content'] + 1 }}")
    with pytest.raises(InvalidArgument):
        t.render_chat([{"role": "user", "content": "hi"}])


@pytest.mark.parametrize(
    "bad",
    [b"", b"{", b'{"version": "1.0"}', b"\xff\xfe not utf-8", b"[]"],
    ids=["empty", "brace", "shape", "bytes", "list"],
)
def test_broken_tokenizer_is_failed_precondition(facts: ModelFacts, template: str, bad: bytes) -> None:
    with pytest.raises(FailedPrecondition, match="tiny"):
        ModelText(facts, bad, template)


@pytest.mark.parametrize(
    "source", ["{% for m in messages %}", "{{ messages[ }}", "{% endif %}", "{{ x | nosuchfilter }}"]
)
def test_broken_template_is_failed_precondition(facts: ModelFacts, tokenizer_json: bytes, source: str) -> None:
    with pytest.raises(FailedPrecondition, match="tiny"):
        ModelText(facts, tokenizer_json, source)


def test_no_template_refuses_chat(facts: ModelFacts, tokenizer_json: bytes) -> None:
    t = ModelText(facts, tokenizer_json, "")
    assert not t.has_chat_template
    with pytest.raises(InvalidArgument, match="no chat template"):
        t.render_chat([{"role": "user", "content": "hi"}])
    assert t.encode("hi")  # completions still work


def test_render_chat_gives_the_template_tools_and_kwargs(text: ModelText) -> None:
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    messages = [{"role": "user", "content": "Hi"}]
    rendered = text.render_chat(messages, tools=[tool], template_kwargs={"enable_thinking": False})
    assert rendered.startswith("<|im_start|>system\n# Tools\n") and '{"function": {"name": "f"' in rendered
    assert rendered.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    plain = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert text.render_chat(messages, tools=None, template_kwargs={}) == plain


@pytest.mark.parametrize("name", ["messages", "tools", "add_generation_prompt", "bos_token"])
def test_template_kwargs_cannot_replace_the_gateways_variables(text: ModelText, name: str) -> None:
    with pytest.raises(InvalidArgument, match=f"chat_template_kwargs.{name}: reserved"):
        text.render_chat([{"role": "user", "content": "Hi"}], template_kwargs={name: "x"})


def test_a_package_template_gets_the_kwargs_it_asks_for(facts: ModelFacts, tokenizer_json: bytes) -> None:
    own = ModelText(facts, tokenizer_json, "{{ custom }}|{{ tools | length if tools else 'none' }}")
    assert own.render_chat([{"role": "user", "content": "x"}], template_kwargs={"custom": "yes"}) == "yes|none"
    assert own.render_chat([{"role": "user", "content": "x"}], tools=[{"a": 1}]) == "|1"
