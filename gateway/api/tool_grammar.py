"""The grammar that makes `tool_choice` `required` or a named function hold: the answer is one or more
`<tool_call>` blocks whose JSON names an offered function and carries arguments that validate
against its `parameters` (docs/gateway.md "Tools and reasoning").

The blocks are the calsim templates' and Qwen3's format, the one `text/tool_calls.py` parses:

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Oslo"}}
    </tool_call>

The grammar is llguidance's Lark dialect with the call's JSON given as an inline JSON schema
(`%json`, compact): the name a `const` of the function (or any of the offered ones, `anyOf`, for
`required`), the arguments the function's `parameters` (`{}` when it has none, as OpenAI reads a
function without them).
With `parallel_tool_calls` (OpenAI's default) more blocks may follow, one a line; without, exactly
one. The board enforces it token by token (docs/daemon.md "Constrained decoding"), so even a model
that would write anything returns calls whose arguments validate.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from calculet.client import Constraint
from calculet.gateway.api.tool_schemas import NamedToolChoice, Tool, ToolChoice
from calculet.gateway.text.tool_calls import CALL_CLOSE, CALL_OPEN

TEXT_TAGS = (orjson.dumps(CALL_OPEN).decode(), orjson.dumps(CALL_CLOSE).decode())
# Compact JSON, as the board writes a json_schema constraint's: a model is never steered into runs of
# whitespace between the call's tokens.
COMPACT = {"whitespace_flexible": False}


# A function without `parameters` takes none (OpenAI: "omitting parameters defines a function with an
# empty parameter list"): its arguments are `{}`.
NO_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}


def call_schema(tool: Tool) -> dict[str, Any]:
    """The JSON schema of one call of `tool`: its name, and arguments matching its parameters."""
    parameters = tool.function.parameters if tool.function.parameters is not None else NO_PARAMETERS
    return {
        "type": "object",
        "properties": {"name": {"const": tool.function.name}, "arguments": parameters},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def call_tags(token_id: Callable[[str], int | None]) -> tuple[str, str]:
    """The grammar's terms for the block's tags: the tokenizer's own tokens where it has them (by id,
    llguidance's `<[ID]>`; Qwen3 has `<tool_call>` and `</tool_call>`), else the text.

    llguidance holds every added token special: a grammar that spells such a token's text cannot be
    followed (its mask offers only the token, which its parser then refuses), so it must name the
    token itself.

    Args:
        token_id: the package tokenizer's id of a token's text (None: no single token).
    """
    terms = []
    for tag in (CALL_OPEN, CALL_CLOSE):
        token = token_id(tag)
        terms.append(f"<[{token}]>" if token is not None else orjson.dumps(tag).decode())
    return terms[0], terms[1]


def tool_call_constraint(
    tools: list[Tool] | None, tool_choice: ToolChoice | None, parallel: bool, tags: tuple[str, str] = TEXT_TAGS
) -> Constraint | None:
    """The constraint a request's tool choice needs, or None (`auto`, `none`, no tools).

    Args:
        tools: the offered tools (checked already: `tool_schemas.tools_for_template`).
        tool_choice: `required` (any offered function) or a named function constrain; others do not.
        parallel: `parallel_tool_calls`: further calls may follow the first.
        tags: the grammar's terms for the opening and closing tags (`call_tags`).
    """
    if not tools or tool_choice is None or tool_choice in ("auto", "none"):
        return None
    if isinstance(tool_choice, NamedToolChoice):
        chosen = [t for t in tools if t.function.name == tool_choice.function.name]
    else:
        chosen = list(tools)
    schemas = [call_schema(t) for t in chosen]
    schema = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
    schema = {**schema, "x-guidance": COMPACT}
    start = 'start: call ("\\n" call)*' if parallel else "start: call"
    call = f'call: {tags[0]} "\\n" %json {orjson.dumps(schema).decode()} "\\n" {tags[1]}'
    return Constraint.of_lark(f"{start}\n{call}\n")
