"""`calctl bench --workload structured|tools` without processes: flags that do not apply are usage
errors naming them; the workload is the same for a seed whatever the order it is asked in, and its
schemas are bounded; each kind of bad answer is caught by the check, and a good one passes; the
validity report counts measured answers only."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from calculet.ops.bench.structured.backend import Verdict
from calculet.ops.bench.structured.report import validity_json
from calculet.ops.bench.structured.schemas import object_schema
from calculet.ops.bench.structured.workload import ChatAnswer, StructuredKind, StructuredWorkload, check
from tests.unit.ops.calctl_fakes import usage_error

GW = ("bench", "--model", "qwen", "--gateway", "http://127.0.0.1:9")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("bench", "--model", "qwen", "--workload", "structured"), "give --gateway URL"),
        ((*GW, "--workload", "tools", "--ignore-eos"), "--ignore-eos: not with --workload tools"),
        ((*GW, "--workload", "structured", "--prompt-len", "8", "--vocab", "9"),
         "--prompt-len, --vocab: not with --workload structured"),
        ((*GW, "--workload", "tools", "--prompts", "p.jsonl"), "--prompts: not with --workload tools"),
        ((*GW, "--thinking-budget", "8"), "--thinking-budget: only with --workload structured or tools"),
        ((*GW, "--workload", "structured", "--thinking-budget", "-1"), "argument --thinking-budget"),
    ],
)  # fmt: skip
def test_bad_flags_are_usage_errors(capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], message: str) -> None:
    assert message in usage_error(capsys, *argv)


@pytest.mark.parametrize("kind", list(StructuredKind))
def test_a_seed_gives_the_same_requests_in_any_order(kind: StructuredKind) -> None:
    first = StructuredWorkload(kind, 3, thinking_budget=16)
    again = StructuredWorkload(kind, 3, thinking_budget=16)
    assert [first.fields(i) for i in range(6)] == [again.fields(i) for i in reversed(range(6))][::-1]
    assert first.fields(0) != StructuredWorkload(kind, 4).fields(0)
    fields, _ = first.fields(1)
    assert fields["thinking_token_budget"] == 16
    off, _ = StructuredWorkload(kind, 3).fields(1)
    assert off["chat_template_kwargs"] == {"enable_thinking": False}


def _bounded(schema: dict[str, Any]) -> bool:
    """Every string has maxLength, every number both bounds, every array maxItems, every object
    additionalProperties false."""
    kind = schema.get("type")
    if kind == "object":
        return schema["additionalProperties"] is False and all(_bounded(v) for v in schema["properties"].values())
    if kind == "array":
        return "maxItems" in schema and _bounded(schema["items"])
    if kind == "string":
        return "maxLength" in schema
    if kind in ("integer", "number"):
        return "minimum" in schema and "maximum" in schema
    return kind == "boolean" or "enum" in schema


def test_the_schemas_are_bounded() -> None:
    assert all(_bounded(object_schema(random.Random(i))) for i in range(300))


def _answer(content: str = "", calls: list[tuple[str, str]] = (), finish: str = "stop") -> ChatAnswer:  # type: ignore[assignment]
    answer = ChatAnswer(content=content, finish_reason=finish)
    for index, (name, arguments) in enumerate(calls):
        answer.add_call_delta({"index": index, "function": {"name": name, "arguments": arguments[:3]}})
        answer.add_call_delta({"index": index, "function": {"arguments": arguments[3:]}})
    return answer


def test_structured_answers_are_checked_against_their_schema() -> None:
    _, drawn = StructuredWorkload(StructuredKind.STRUCTURED, 0).fields(0)
    assert drawn.schema is not None and drawn.schema["type"] == "object"
    schema = {"type": "object", "properties": {"a": {"enum": ["x"]}}, "required": ["a"], "additionalProperties": False}
    expect = type(drawn)(schema=schema)
    assert check(expect, _answer('{"a": "x"}')) is None
    assert check(expect, _answer("{not json", finish="length")) == "content is not JSON (finish length)"
    assert check(expect, _answer('{"a": "y"}')) == "content does not validate"
    assert check(expect, _answer(json.dumps([1]))) == "content does not validate"


def test_tool_answers_must_make_one_valid_call_of_the_right_function() -> None:
    workload = StructuredWorkload(StructuredKind.TOOLS, 0)
    _, required = workload.fields(0)
    _, named = workload.fields(1)
    assert required.named is None and named.named is not None and required.parameters is not None
    name = next(iter(required.parameters))
    empty = {"type": "object", "properties": {}, "additionalProperties": False}
    required = type(required)(parameters={name: empty}, named=None)
    assert check(required, _answer(calls=[(name, "{}")], finish="tool_calls")) is None
    assert check(required, _answer(calls=[(name, "{}")], finish="length")) == "finish reason length, not tool_calls"
    assert check(required, _answer(calls=[], finish="tool_calls")) == "0 calls, not 1"
    assert check(required, _answer(calls=[(name, "{}")] * 2, finish="tool_calls")) == "2 calls, not 1"
    assert check(required, _answer(calls=[("nope", "{}")], finish="tool_calls")) == "called 'nope'"
    assert check(required, _answer(calls=[(name, "{oops")], finish="tool_calls")) == "arguments are not JSON"
    assert check(required, _answer(calls=[(name, '{"x": 1}')], finish="tool_calls")) == "arguments do not validate"
    other = type(named)(parameters={name: empty, "other": empty}, named="other")
    assert check(other, _answer(calls=[(name, "{}")], finish="tool_calls")) == f"called {name!r}"


def test_the_validity_report_counts_measured_answers_only() -> None:
    verdicts = {
        0: Verdict("bad", "length"),
        1: Verdict(None, "stop"),
        2: Verdict("worse", "stop"),
        3: Verdict(None, "stop"),
    }
    report = validity_json(verdicts, [1, 2, 3, 4])  # 0 was a warm-up; 4 failed (no verdict)
    assert report == {
        "checked": 3,
        "valid": 2,
        "valid_share": 2 / 3,
        "finish_reasons": {"stop": 3},
        "problems": [{"index": 2, "problem": "worse"}],
    }
