"""Reasoning and tool calls read from a chat answer's text: whole, and cut into pieces at every
place (what streaming does), the pieces always adding up to the whole answer's reading; no part of
a tag ever reaches reasoning or content."""

from __future__ import annotations

import json

import pytest

from calculet.gateway.text.chat_output import ChatOutput, OutputSpec
from calculet.gateway.text.reasoning import ReasoningSplitter, prompt_opens_thinking
from calculet.gateway.text.tags import held_tail
from calculet.gateway.text.tool_calls import CallPart, ParsedCall, ToolCallParser, parse_block

Reading = tuple[str, str, list[tuple[str, str]]]


def _read(spec: OutputSpec, pieces: list[str]) -> tuple[Reading, str]:
    """(reasoning, content, [(name, arguments)]) of an answer fed in `pieces`, and its finish reason."""
    out = ChatOutput(spec)
    reasoning, content, calls = "", "", []
    for piece in [*(out.feed(p) for p in pieces), out.finish()]:
        reasoning += piece.reasoning
        content += piece.content
        calls += [(c.name, c.arguments) for c in piece.calls]
    return (reasoning, content, calls), out.finish_reason("stop")


def _splits(text: str) -> list[list[str]]:
    """The text whole, one character a piece, and cut in two at every place."""
    return [[text], list(text), *([text[:i], text[i:]] for i in range(1, len(text)))]


def _check(spec: OutputSpec, text: str, expected: Reading, reason: str = "stop") -> None:
    for pieces in _splits(text):
        assert _read(spec, pieces) == (expected, reason), pieces


def test_held_tail() -> None:
    assert held_tail("abc<thi", "<think>") == 4
    assert held_tail("abc<", "<think>") == 1
    assert held_tail("abc", "<think>") == 0
    assert held_tail("<think", "<think>") == 6


@pytest.mark.parametrize(
    ("text", "reasoning", "content"),
    [
        ("<think>\nLet me add.\n</think>\n\n4", "Let me add.", "4"),
        ("<think>a\n\nb</think>c <think>d</think>", "a\n\nb", "c <think>d</think>"),
        ("<think>\n\n</think>\n\nHello", "", "Hello"),
        ("Hello <think>not at the start</think>", "", "Hello <think>not at the start</think>"),
        (" <think>x</think>y", "", " <think>x</think>y"),
        ("<thin", "", "<thin"),  # the whole answer is a prefix of the tag: content
        ("<think>cut short by max_tokens\n</thi", "cut short by max_tokens\n</thi", ""),
        ("<think>unclosed\n\n", "unclosed", ""),
        ("no reasoning at all", "", "no reasoning at all"),
    ],
)
def test_reasoning_at_the_start_is_separated(text: str, reasoning: str, content: str) -> None:
    _check(OutputSpec(), text, (reasoning, content, []))


def test_a_prompt_that_opened_the_think_block_makes_the_answer_start_as_reasoning() -> None:
    assert prompt_opens_thinking("<|im_start|>assistant\n<think>\n")
    assert not prompt_opens_thinking("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not prompt_opens_thinking("<|im_start|>assistant\n")
    _check(OutputSpec(in_think=True), "\nworking\n</think>\n\nDone.", ("working", "Done.", []))
    _check(OutputSpec(in_think=True), "all thought", ("all thought", "", []))


def test_the_reasoning_splitter_streams_reasoning_before_the_block_ends() -> None:
    splitter = ReasoningSplitter()
    assert splitter.feed("<think>\nstep one") == ("step one", "")
    assert splitter.feed("\n") == ("", "")  # may be the newline before </think>
    assert splitter.feed("step two</think>\n") == ("\nstep two", "")
    assert splitter.feed("\nAnswer") == ("", "Answer")
    assert splitter.finish() == ("", "")


WEATHER = '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "°C"}}'
TOOLS = OutputSpec(parse_tools=True)


def test_parse_block() -> None:
    assert parse_block(WEATHER) == ("get_weather", '{"city": "Paris", "unit": "°C"}')
    assert parse_block('{"name": "f"}') == ("f", "{}")
    for bad in ('{"name": "f", "arguments": "x"}', '{"arguments": {}}', '{"name": ""}', "[1]", "{not json", ""):
        assert parse_block(bad) is None, bad


@pytest.mark.parametrize(
    ("text", "content", "calls"),
    [
        (f"<tool_call>\n{WEATHER}\n</tool_call>", "", [("get_weather", '{"city": "Paris", "unit": "°C"}')]),
        (
            f"Let me check.\n<tool_call>\n{WEATHER}\n</tool_call>\n<tool_call>\n"
            '{"name": "f", "arguments": {}}\n</tool_call>\n',
            "Let me check.",
            [("get_weather", '{"city": "Paris", "unit": "°C"}'), ("f", "{}")],
        ),
        # A block that does not parse stays content, word for word.
        ("Hi\n<tool_call>\n{broken\n</tool_call> after", "Hi\n<tool_call>\n{broken\n</tool_call> after", []),
        ("plain text, no calls <tool", "plain text, no calls <tool", []),
        # Never closed (cut by max_tokens): once its head is there it is a call, with the arguments it has.
        (f"<tool_call>\n{WEATHER}", "", [("get_weather", '{"city": "Paris", "unit": "°C"}')]),
        ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa', "", [("get_weather", '{"city": "Pa')]),
        ('<tool_call>\n{"name": "get_w', '<tool_call>\n{"name": "get_w', []),  # before its head: content
        (
            f"<tool_call>{WEATHER}</tool_call>Then text.",
            "Then text.",
            [("get_weather", '{"city": "Paris", "unit": "°C"}')],
        ),
    ],
)
def test_tool_call_blocks_become_calls(text: str, content: str, calls: list[tuple[str, str]]) -> None:
    _check(TOOLS, text, ("", content, calls), "tool_calls" if calls else "stop")


def test_without_tools_blocks_stay_content() -> None:
    text = f"<tool_call>{WEATHER}</tool_call>"
    _check(OutputSpec(), text, ("", text, []))


def test_reasoning_then_a_call() -> None:
    text = f"<think>\nThe user wants weather.\n</think>\n\n<tool_call>\n{WEATHER}\n</tool_call>"
    expected = ("The user wants weather.", "", [("get_weather", '{"city": "Paris", "unit": "°C"}')])
    _check(TOOLS, text, expected, "tool_calls")
    # A call written inside the reasoning is reasoning.
    inside = f"<think><tool_call>{WEATHER}</tool_call></think>ok"
    _check(TOOLS, inside, (f"<tool_call>{WEATHER}</tool_call>", "ok", []))


def test_without_parallel_tool_calls_only_the_first_call_is_kept() -> None:
    two = f"<tool_call>{WEATHER}</tool_call>\n<tool_call>" + '{"name": "g", "arguments": {"a": 1}}</tool_call>'
    _check(OutputSpec(parse_tools=True, parallel_tool_calls=False), two, ("", "", [("get_weather", json.dumps(
        {"city": "Paris", "unit": "°C"}, ensure_ascii=False))]), "tool_calls")  # fmt: skip


def test_calls_have_indexes_and_ids() -> None:
    parser = ToolCallParser()
    piece = parser.feed(f"<tool_call>{WEATHER}</tool_call><tool_call>" + '{"name": "g"}</tool_call>')
    assert piece.content == "" and [c.index for c in piece.calls] == [0, 1]
    assert all(c.id.startswith("call_") and len(c.id) == 29 for c in piece.calls)
    assert piece.calls[0].id != piece.calls[1].id


def _parts(parallel: bool, pieces: list[str]) -> list[CallPart]:
    parser = ToolCallParser(parallel)
    parts = [part for text in pieces for part in parser.feed(text).parts]
    return parts + parser.finish().parts


TRICKY = '{"q": "a}\\"b{[", "n": [1, {"x": null}]}'  # braces and an escaped quote inside a string


@pytest.mark.parametrize("cut", [1, 3, 7])
def test_a_call_streams_its_name_first_then_its_arguments_in_pieces(cut: int) -> None:
    text = f'Hi <tool_call>\n{{"name": "search", "arguments": {TRICKY}}}\n</tool_call>'
    pieces = [text[i : i + cut] for i in range(0, len(text), cut)]
    head, *middle, last = _parts(True, pieces)
    assert head.name == "search" and head.id is not None and head.arguments == "" and head.call is None
    assert len(middle) > 1 and all(p.id is None and p.name is None and p.call is None for p in middle)
    assert "".join(p.arguments for p in middle) == TRICKY  # the model's text, not a re-serialization
    assert last.call == ParsedCall(0, head.id, "search", TRICKY) and last.arguments == ""
    assert {p.index for p in (head, *middle, last)} == {0}


def test_a_call_whose_head_is_not_name_first_is_read_when_its_block_closes() -> None:
    text = '<tool_call>{"arguments": {"a": 1}, "name": "f"}</tool_call>'
    for pieces in _splits(text):
        head, arguments, last = _parts(True, pieces)
        assert (head.name, arguments.arguments) == ("f", '{"a": 1}') and last.call is not None


def test_without_parallel_tool_calls_a_second_call_is_never_announced() -> None:
    text = '<tool_call>{"name": "f", "arguments": {}}</tool_call>\n<tool_call>{"name": "g", "arguments": {"b": 2}}'
    for pieces in _splits(text):
        parts = _parts(False, pieces)
        assert {p.index for p in parts} == {0} and [p.name for p in parts if p.name] == ["f"]


def test_a_call_cut_in_its_arguments_ends_incomplete() -> None:
    parser = ToolCallParser()
    parser.feed('<tool_call>{"name": "f", "arguments": {"a": [1, ')
    end = parser.finish()
    assert end.content == "" and [c.complete for c in end.calls] == [False] and end.calls[0].arguments == '{"a": [1, '


def test_length_is_kept_as_the_finish_reason_even_after_a_call() -> None:
    out = ChatOutput(TOOLS)
    out.feed(f"<tool_call>{WEATHER}</tool_call>")
    assert out.called and out.finish_reason("length") == "length" and out.finish_reason("stop") == "tool_calls"


def test_the_splitter_says_where_the_answer_is() -> None:
    splitter = ReasoningSplitter()
    parts = [splitter.part]
    for text in ("<thi", "nk>\nstep", "</think>\n", "\n", "Answer"):
        splitter.feed(text)
        parts.append(splitter.part)
    assert parts == ["undecided", "undecided", "reasoning", "layout", "layout", "content"]
    plain = ChatOutput(OutputSpec())
    plain.feed("Hi")
    assert plain.part == "content"
    assert ChatOutput(OutputSpec(in_think=True)).part == "reasoning"
