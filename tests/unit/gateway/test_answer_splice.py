"""`splice_chat` with the tiny package's real tokenizer and ChatML template: a remembered answer's
ids replace its text, so the next turn's prompt is the previous prompt's ids, then the ids the
model produced, then the rest encoded; a template that transforms content is never spliced."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from calculet.gateway.text.answer_splice import placeholder, splice_chat
from calculet.gateway.text.model_text import ModelFacts, ModelText
from calculet.ops.sim_packages.build import build_sim_package

SYSTEM = {"role": "system", "content": "You are terse."}
FIRST = {"role": "user", "content": "Tell me about lanes."}
SECOND = {"role": "user", "content": "And parking?"}
THIRD = {"role": "user", "content": "Why?"}
ANSWER = "Hello there, lanes park themselves."
ANSWER_2 = "Because the KV stays put."


@pytest.fixture(scope="module")
def text(tmp_path_factory: pytest.TempPathFactory) -> ModelText:
    package = Path(build_sim_package("tiny", tmp_path_factory.mktemp("answer_splice") / "tiny"))
    tokenizer_json = (package / "tokenizer" / "tokenizer.json").read_bytes()
    template = (package / "tokenizer" / "chat_template.jinja").read_text(encoding="utf-8")
    return with_template(tokenizer_json, template)


def with_template(tokenizer_json: bytes, template: str) -> ModelText:
    facts = ModelFacts("tiny", "0" * 64, 100_000, 4096, ())
    return ModelText(facts, tokenizer_json, template)


def produced(text: ModelText, answer: str) -> list[int]:
    """Ids a model could have produced for `answer` that re-encoding never gives: one character
    at a time, then a padding id past the tokenizer (rendered as nothing)."""
    ids = [i for ch in answer for i in text.encode(ch)] + [text.tokenizer_size + 3]
    assert ids[:-1] != text.encode(answer), "the answer must encode differently as a whole"
    return ids


def render(text: ModelText, messages: Sequence[dict[str, str]]) -> str:
    return text.render_chat(messages, add_generation_prompt=True)


def test_the_next_turn_is_the_previous_prompt_then_the_produced_ids_then_the_rest(text: ModelText) -> None:
    before = render(text, [SYSTEM, FIRST])
    before_ids = text.encode(before)  # the first turn's prompt, as the gateway encoded it
    answer_ids = produced(text, ANSWER)
    messages = [SYSTEM, FIRST, {"role": "assistant", "content": ANSWER}, SECOND]
    rendered = render(text, messages)
    spliced = splice_chat(text, messages, True, {2: answer_ids}, rendered)
    assert spliced is not None and spliced.spliced == 1
    rest = rendered[len(before) + len(ANSWER) :]
    assert rest.startswith("<|im_end|>\n<|im_start|>user\n")
    assert spliced.encode(text) == [*before_ids, *answer_ids, *text.encode(rest)]
    assert spliced.encode(text) != text.encode(rendered)
    assert spliced.text_chars == len(rendered) - len(ANSWER)


def test_each_turn_extends_the_previous_spliced_prompt(text: ModelText) -> None:
    first_ids, second_ids = produced(text, ANSWER), produced(text, ANSWER_2)
    turn2 = [SYSTEM, FIRST, {"role": "assistant", "content": ANSWER}, SECOND]
    turn2_prompt = splice_chat(text, turn2, True, {2: first_ids}, render(text, turn2))
    turn3 = [*turn2, {"role": "assistant", "content": ANSWER_2}, THIRD]
    turn3_prompt = splice_chat(text, turn3, True, {2: first_ids, 4: second_ids}, render(text, turn3))
    assert turn2_prompt is not None and turn3_prompt is not None and turn3_prompt.spliced == 2
    head = [*turn2_prompt.encode(text), *second_ids]
    assert turn3_prompt.encode(text)[: len(head)] == head


def test_nothing_remembered_is_not_spliced(text: ModelText) -> None:
    messages = [SYSTEM, FIRST, {"role": "assistant", "content": ANSWER}, SECOND]
    assert splice_chat(text, messages, True, {}, render(text, messages)) is None


def test_placeholders_are_taken_in_the_order_the_template_renders_them(text: ModelText) -> None:
    reverse = (
        "{% for m in messages | reverse %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "<|im_start|>assistant\n"
    )
    reversed_text = with_template(text.tokenizer.to_str().encode(), reverse)
    a, b = produced(text, ANSWER), produced(text, ANSWER_2)
    messages = [FIRST, {"role": "assistant", "content": ANSWER}, SECOND, {"role": "assistant", "content": ANSWER_2}]
    rendered = render(reversed_text, messages)
    spliced = splice_chat(reversed_text, messages, True, {1: a, 3: b}, rendered)
    assert spliced is not None
    end_b = rendered.index(ANSWER_2) + len(ANSWER_2)
    start_a = rendered.index(ANSWER)
    segments = [rendered[: rendered.index(ANSWER_2)], rendered[end_b:start_a], rendered[start_a + len(ANSWER) :]]
    expected = [*text.encode(segments[0]), *b, *text.encode(segments[1]), *a, *text.encode(segments[2])]
    assert spliced.encode(reversed_text) == expected


PASS_THROUGH = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "<|im_start|>assistant\n"
)


def transformed(text: ModelText, content: str) -> ModelText:
    """The tiny tokenizer with a ChatML template that renders each message's content by `content`."""
    return with_template(text.tokenizer.to_str().encode(), PASS_THROUGH.replace("{{ m['content'] }}", content, 1))


def test_a_template_that_passes_the_content_through_is_spliced(text: ModelText) -> None:
    plain = transformed(text, "{{ m['content'] }}")
    messages = [FIRST, {"role": "assistant", "content": ANSWER}, SECOND]
    spliced = splice_chat(plain, messages, True, {1: produced(text, ANSWER)}, render(plain, messages))
    assert spliced is not None and spliced.spliced == 1


@pytest.mark.parametrize(
    ("content", "answer"),
    [
        ("{{ m['content'] | upper }}", ANSWER),  # the placeholder survives, the content does not
        ("{{ m['content'] }}{{ m['content'] }}", ANSWER),  # rendered twice
        ("{{ m['content'][:8] }}", ANSWER),  # cut: the placeholder is destroyed
        ("{{ m['content'].split('</think>')[-1] }}", "<think>lanes</think>" + ANSWER),  # reasoning dropped
        (
            "{% if m['role'] == 'assistant' and m['content'][0] != 'H' and m['content'][0] != '<' %}"
            "{{ raise_exception('not H') }}{% endif %}{{ m['content'] }}",
            ANSWER,
        ),  # the template refuses the placeholders (but not the real content)
    ],
)
def test_a_template_that_transforms_the_content_falls_back(text: ModelText, content: str, answer: str) -> None:
    transforming = transformed(text, content)
    messages = [FIRST, {"role": "assistant", "content": answer}, SECOND]
    rendered = render(transforming, messages)  # the plain rendering works: the request is served plainly
    assert splice_chat(transforming, messages, True, {1: produced(text, answer)}, rendered) is None


def test_a_message_that_contains_a_placeholder_falls_back(text: ModelText) -> None:
    messages = [
        {"role": "user", "content": f"what is {placeholder(1)}?"},
        {"role": "assistant", "content": ANSWER},
        SECOND,
    ]
    assert splice_chat(text, messages, True, {1: produced(text, ANSWER)}, render(text, messages)) is None
    assert " " not in placeholder(12) and "\n" not in placeholder(12)
