"""The grammar of `tool_choice` `required` and named (`gateway/api/tool_grammar.py`), compiled by
the board's compiler against the tiny package's tokenizer: whatever the logits, what the sampler
draws under its masks is `<tool_call>` blocks that the gateway's parser reads as calls of the
offered functions whose arguments validate against their parameters."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest

from calculet.daemon.grammar import GrammarCompiler
from calculet.daemon.sampling.constraint import Constraint, ConstraintKind
from calculet.gateway.api.tool_grammar import tool_call_constraint
from calculet.gateway.api.tool_schemas import NamedToolChoice, Tool
from calculet.gateway.text.tool_calls import ToolCallParser
from tests.unit.grammar.test_grammar import compiler, decode, generate, package  # noqa: F401  (fixtures)

WEATHER = {
    "type": "object",
    "properties": {"city": {"enum": ["Oslo", "Rome"]}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "days"],
    "additionalProperties": False,
}
TOOLS = [
    Tool.model_validate({"type": "function", "function": {"name": "weather", "parameters": WEATHER}}),
    Tool.model_validate({"type": "function", "function": {"name": "now"}}),
]
PARAMETERS: dict[str, dict[str, Any]] = {"weather": WEATHER, "now": {"type": "object", "maxProperties": 0}}


def board_constraint(choice: Any, parallel: bool = False) -> Constraint:
    c = tool_call_constraint(TOOLS, choice, parallel)
    assert c is not None and c.kind == "lark"
    return Constraint(ConstraintKind.LARK, c.text)


def calls_of(text: str) -> list[tuple[str, dict[str, Any]]]:
    parser = ToolCallParser(parallel=True)
    content, calls = parser.feed(text)
    rest = parser.finish()
    assert not (content + rest).strip(), (content, rest)  # nothing but calls
    return [(call.name, json.loads(call.arguments)) for call in calls]


@pytest.mark.parametrize("seed", range(12))
def test_a_named_function_is_called_with_valid_arguments(compiler: GrammarCompiler, decode, seed: int) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    named = NamedToolChoice.model_validate({"type": "function", "function": {"name": "weather"}})
    tokens, ended = generate(compiler, board_constraint(named), seed)
    text = decode(tokens)
    assert ended, text
    ((name, arguments),) = calls_of(text)
    assert name == "weather"
    jsonschema.validate(arguments, WEATHER)


@pytest.mark.parametrize("seed", range(12))
def test_required_calls_one_of_the_offered_functions(compiler: GrammarCompiler, decode, seed: int) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    tokens, ended = generate(compiler, board_constraint("required"), seed)
    text = decode(tokens)
    assert ended, text
    ((name, arguments),) = calls_of(text)
    jsonschema.validate(arguments, PARAMETERS[name])


def test_no_constraint_for_auto_none_or_no_tools() -> None:
    assert tool_call_constraint(TOOLS, "auto", True) is None
    assert tool_call_constraint(TOOLS, "none", True) is None
    assert tool_call_constraint(TOOLS, None, True) is None
    assert tool_call_constraint(None, "required", True) is None


def test_parallel_calls_may_follow_the_first_only_when_asked() -> None:
    one = tool_call_constraint(TOOLS, "required", False)
    more = tool_call_constraint(TOOLS, "required", True)
    assert one is not None and more is not None
    assert one.text.startswith("start: call\n") and more.text.startswith('start: call ("\\n" call)*\n')
