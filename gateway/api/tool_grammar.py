"""The grammar of a request's tool calls. With `tool_choice` `required` or a named function the
answer is one or more `<tool_call>` blocks whose JSON names an offered function and carries
arguments that validate against its `parameters` (docs/gateway.md "Tools and reasoning").

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

Under `auto` (and a `tool_choice` left out) the grammar is lazy, as llama.cpp's and llguidance's
tool-call grammars are: free text, which may end the answer, until the opening tag; from the tag on,
the same calls, and after them nothing but further calls (with `parallel_tool_calls`) or the end.
Where the tag is the tokenizer's own token the text cannot hold it, so the token is the trigger;
where it is text, a lazy lexeme ends the free text at the tag's first occurrence.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from calculet.client import Constraint
from calculet.gateway.api.tool_schemas import NamedToolChoice, Tool, ToolChoice
from calculet.gateway.text.tool_calls import CALL_CLOSE, CALL_OPEN

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


@dataclass(frozen=True)
class CallTags:
    """The grammar's terms for a call block's tags.

    Attributes:
        open: the opening tag's term (`<[ID]>` for a token, else the quoted text).
        close: the closing tag's.
        special: the tags are tokens, which free text can never contain.
    """

    open: str
    close: str
    special: bool


TEXT_TAGS = CallTags(orjson.dumps(CALL_OPEN).decode(), orjson.dumps(CALL_CLOSE).decode(), special=False)


def call_tags(token_id: Callable[[str], int | None]) -> CallTags:
    """The grammar's terms for the block's tags: the tokenizer's own tokens where it has both (by id,
    llguidance's `<[ID]>`; Qwen3 has `<tool_call>` and `</tool_call>`), else the text.

    llguidance holds every added token special: a grammar that spells such a token's text cannot be
    followed (its mask offers only the token, which its parser then refuses), so it must name the
    token itself.

    Args:
        token_id: the package tokenizer's id of a token's text (None: no single token).
    """
    opening, closing = token_id(CALL_OPEN), token_id(CALL_CLOSE)
    if opening is None or closing is None:
        return TEXT_TAGS
    return CallTags(f"<[{opening}]>", f"<[{closing}]>", special=True)


def tool_call_constraint(
    tools: list[Tool] | None, tool_choice: ToolChoice | None, parallel: bool, tags: CallTags = TEXT_TAGS
) -> Constraint | None:
    """The constraint of a request's tool calls, or None (`none`, or no tools).

    Args:
        tools: the offered tools (checked already: `tool_schemas.tools_for_template`).
        tool_choice: `required` (any offered function) or a named function: the answer is calls;
            `auto` or None (OpenAI's default with tools): free text, then calls (the lazy grammar).
        parallel: `parallel_tool_calls`: further calls may follow the first.
        tags: the grammar's terms for the opening and closing tags (`call_tags`).
    """
    if not tools or tool_choice == "none":
        return None
    if isinstance(tool_choice, NamedToolChoice):
        chosen = [t for t in tools if t.function.name == tool_choice.function.name]
    else:
        chosen = list(tools)
    schemas = [call_schema(t) for t in chosen]
    schema = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
    body = f'"\\n" %json {orjson.dumps({**schema, "x-guidance": COMPACT}).decode()} "\\n" {tags.close}'
    more = ' ("\\n" call)*' if parallel else ""
    if tool_choice is not None and tool_choice != "auto":
        return Constraint.of_lark(f"start: call{more}\ncall: {tags.open} {body}\n")
    return Constraint.of_lark(_lazy(tags, body, more))


def _lazy(tags: CallTags, body: str, more: str) -> str:
    """`auto`'s grammar: free text (which may end the answer), or free text then calls."""
    head = f"%llguidance {{}}\nTEXT: /(.|\\n)*/\ncall: {tags.open} {body}\n"
    if tags.special:  # the token cannot be text: it ends the free text by itself
        return head + f"start: TEXT | TEXT call{more}\n"
    # A lazy lexeme ends at the tag's first occurrence, so the free text never holds the tag.
    return head + f"start: TEXT | opened {body}{more}\nopened[lazy]: TEXT {tags.open}\n"
