"""OpenAI's tool fields of a chat request: the tools offered, the choice among them, and the calls
an assistant message made (docs/gateway.md "Tools and reasoning").

Validated strictly like the rest of the body (`schemas.py`): a function name as OpenAI allows it
(letters, digits, `_` and `-`, at most 64), `parameters` a JSON Schema object (a JSON object whose
`type`, when given, is "object": a function's arguments are one object), names unique, and a named
`tool_choice` naming one of the tools.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator

from calculet.common.errors import InvalidArgument
from calculet.gateway.api.lenient import Lenient

MAX_TOOLS = 128  # OpenAI's own bound on `tools`
FUNCTION_NAME = r"^[A-Za-z0-9_-]{1,64}$"


class FunctionDef(Lenient):
    name: Annotated[str, Field(pattern=FUNCTION_NAME)]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    @field_validator("parameters")
    @classmethod
    def _object_schema(cls, parameters: dict[str, Any] | None) -> dict[str, Any] | None:
        if parameters is not None and parameters.get("type", "object") != "object":
            raise ValueError("must be a JSON Schema of an object (type 'object'): arguments are one JSON object")
        return parameters


class Tool(Lenient):
    type: Literal["function"]
    function: FunctionDef


class _FunctionName(Lenient):
    name: Annotated[str, Field(pattern=FUNCTION_NAME)]


class NamedToolChoice(Lenient):
    type: Literal["function"]
    function: _FunctionName


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class FunctionCall(Lenient):
    name: Annotated[str, Field(min_length=1, max_length=64)]
    arguments: str


class ToolCall(Lenient):
    """A call in an assistant message of the history (its `arguments` a JSON string, as OpenAI's)."""

    id: Annotated[str, Field(min_length=1, max_length=256)]
    type: Literal["function"]
    function: FunctionCall


def tools_for_template(
    tools: list[Tool] | None, tool_choice: ToolChoice | None
) -> tuple[list[dict[str, Any]] | None, bool]:
    """What the template is given and whether the answer is parsed for calls.

    OpenAI's semantics: no tools means no calls; `tool_choice` "none" means the model must not
    call, so the template is not given the tools (no call is asked for) and nothing is parsed;
    "auto" (the default with tools), "required" and a named function give the tools and parse.

    Args:
        tools: the request's `tools`.
        tool_choice: the request's `tool_choice`.
    Returns:
        (the tools as the template sees them or None, whether to parse `<tool_call>` blocks).
    Raises:
        InvalidArgument: more than `MAX_TOOLS` tools, two with one name, a `tool_choice` other
            than "none" without tools, or a named choice that is not among the tools.
    """
    if not tools:
        if tool_choice is not None and tool_choice != "none":
            raise InvalidArgument("tool_choice: only allowed when tools are given")
        return None, False
    if len(tools) > MAX_TOOLS:
        raise InvalidArgument(f"tools: {len(tools)} tools; at most {MAX_TOOLS}")
    names = [t.function.name for t in tools]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise InvalidArgument(f"tools[{i}].function.name: {name!r} is given twice")
    if isinstance(tool_choice, NamedToolChoice) and tool_choice.function.name not in names:
        raise InvalidArgument(f"tool_choice.function.name: {tool_choice.function.name!r} is not among the tools")
    if tool_choice == "none":
        return None, False
    return [t.model_dump(exclude_none=True) for t in tools], True
