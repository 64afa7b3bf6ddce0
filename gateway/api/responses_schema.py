"""The Responses API's request body (`POST /v1/responses`), parsed strictly like chat's, and its
translation into a `ChatCompletionRequest`: the Responses API is served by the chat path
(docs/gateway.md "Responses API").

Stateless: nothing is stored, so `previous_response_id`, `conversation` and `store: true` are 400s
and a conversation is sent whole as `input`. Input items become chat messages: `instructions` a
system message first; messages as they are (content parts `input_text` / `output_text` joined);
`function_call` items as the preceding assistant message's `tool_calls` (a new assistant message
when none precedes them); `function_call_output` items as `tool` messages; a `reasoning` item as the
`reasoning_content` of the assistant message that follows it (dropped when none does). Errors name
the Responses field (`input[3].call_id`), never the chat field it becomes.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Annotated, Any, Literal, TypeVar

from pydantic import Field, ValidationError, field_validator, model_validator

from calculet.common.errors import InvalidArgument
from calculet.gateway.api.lenient import Lenient
from calculet.gateway.api.refused_fields import StorageRefusals, check_output_format, refuse
from calculet.gateway.api.schemas import (
    MAX_MESSAGES,
    MAX_TOOL_CALLS,
    SEED_MAX,
    SEED_MIN,
    ChatCompletionRequest,
    validation_error,
)
from calculet.gateway.api.tool_schemas import MAX_TOOLS, FunctionDef

STATELESS = "no response is stored here (stateless): send the whole conversation as `input`"
CALL_ID = Annotated[str, Field(min_length=1, max_length=256)]
TEXT_PARTS = ("input_text", "output_text")
TOOL_CHOICES = ("none", "auto", "required")


class _TextPart(Lenient):
    type: Literal["input_text", "output_text"]
    text: str


class _Message(Lenient):
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[dict[str, Any]]


class _FunctionCall(Lenient):
    type: Literal["function_call"]
    call_id: CALL_ID
    name: Annotated[str, Field(min_length=1, max_length=64)]
    arguments: str


class _FunctionCallOutput(Lenient):
    type: Literal["function_call_output"]
    call_id: CALL_ID
    output: str | list[dict[str, Any]]


class _ReasoningPart(Lenient):
    text: str


class _Reasoning(Lenient):
    type: Literal["reasoning"]
    summary: list[_ReasoningPart] = Field(default_factory=list)
    content: list[_ReasoningPart] | None = None

    def text(self) -> str:
        """The reasoning's text: its content when given, else its summary."""
        parts = self.content if self.content else self.summary
        return "\n".join(part.text for part in parts)


_ITEMS: dict[str, type[Lenient]] = {
    "message": _Message,
    "function_call": _FunctionCall,
    "function_call_output": _FunctionCallOutput,
    "reasoning": _Reasoning,
}


class FunctionTool(FunctionDef):
    """A function tool in the Responses shape: flat (`name` beside `type`), unlike chat's."""

    type: Literal["function"]

    @model_validator(mode="before")
    @classmethod
    def _function_only(cls, value: Any) -> Any:
        # Before the fields: a built-in tool (web_search, file_search, ...) lacks a name, but what
        # to say is that its type is not served.
        if isinstance(value, dict) and value.get("type") != "function":
            raise ValueError(f"type {str(value.get('type'))[:32]!r} is not served; only 'function' tools")
        return value


class TextConfig(Lenient):
    format: dict[str, Any] | None = None
    verbosity: Any = None

    _verbosity = field_validator("verbosity")(refuse("the answer's length is max_output_tokens' to bound"))

    @field_validator("format")
    @classmethod
    def _format(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None:
            check_output_format(value.get("type"))
            if value.get("type") == "json_schema" and not isinstance(value.get("schema"), dict):
                raise ValueError("type 'json_schema' needs its `schema` object")
        return value

    def chat_response_format(self) -> dict[str, Any] | None:
        """The format as chat's `response_format` (the Responses shape is flat: `{"type":
        "json_schema", "name", "schema", "strict"}`; chat nests the last three in `json_schema`)."""
        f = self.format
        if f is None or f.get("type") == "text":
            return None
        if f.get("type") == "json_object":
            return {"type": "json_object"}
        nested = {k: f[k] for k in ("name", "description", "schema", "strict") if f.get(k) is not None}
        return {"type": "json_schema", "json_schema": nested}


class ReasoningConfig(Lenient):
    effort: Literal["low", "medium", "high"] | None = None  # served as chat's `reasoning_effort`
    summary: Any = None
    generate_summary: Any = None

    _summary = field_validator("summary", "generate_summary")(
        refuse("no summaries here; the reasoning comes whole as the reasoning item's content")
    )


class ResponsesRequest(StorageRefusals):
    """`POST /v1/responses`: OpenAI's fields, and chat's `chat_template_kwargs` and `seed` as extensions."""

    model: Annotated[str, Field(min_length=1, max_length=128)]
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: Annotated[list[FunctionTool], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool = True
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    max_output_tokens: Annotated[int, Field(ge=1, le=2**32 - 1)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    stream: bool = False
    user: Annotated[str, Field(max_length=256)] | None = None
    prompt_cache_key: Annotated[str, Field(max_length=256)] | None = None
    metadata: dict[str, str] | None = None
    safety_identifier: Annotated[str, Field(max_length=256)] | None = None
    # Extensions, as chat takes them: template variables (vLLM's name) and a seed (reproducible answers).
    chat_template_kwargs: dict[str, Any] | None = None
    seed: Annotated[int, Field(ge=SEED_MIN, le=SEED_MAX)] | None = None
    # Refused: state this gateway does not keep, and features it does not serve here.
    previous_response_id: Any = None
    conversation: Any = None
    prompt: Any = None
    background: bool | None = None
    include: list[str] | None = None
    truncation: str | None = None
    max_tool_calls: Any = None
    top_logprobs: Any = None

    _previous = field_validator("previous_response_id", "conversation")(refuse(STATELESS))
    _prompt = field_validator("prompt")(refuse("stored prompt templates are not served; send `input`"))
    _max_calls = field_validator("max_tool_calls")(refuse("built-in tools are not served; nothing bounds calls"))
    _logprobs = field_validator("top_logprobs")(refuse("logprobs are not served on /v1/responses"))

    @field_validator("input", mode="wrap")
    @classmethod
    def _input(cls, value: Any, handler: Any) -> Any:
        # Checked by hand: a union's errors would name its members (`input.str`), not the field.
        if isinstance(value, list) and not value:
            raise ValueError("must not be empty")
        if isinstance(value, list) and len(value) > MAX_MESSAGES:
            raise ValueError(f"{len(value)} items; at most {MAX_MESSAGES}")
        items = value if isinstance(value, list) else []
        if not isinstance(value, str | list) or not all(isinstance(item, dict) for item in items):
            raise ValueError("must be a string or a list of items (objects)")
        return handler(value)

    @field_validator("tool_choice")
    @classmethod
    def _tool_choice(cls, value: Any) -> Any:
        if value is None or value in TOOL_CHOICES:
            return value
        if isinstance(value, dict) and value.get("type") == "function" and isinstance(value.get("name"), str):
            return value
        raise ValueError("must be 'none', 'auto', 'required' or {'type': 'function', 'name': ...}")

    @field_validator("background")
    @classmethod
    def _background(cls, value: bool | None) -> bool | None:
        if value:
            raise ValueError("not supported: background responses need a store (this gateway keeps none)")
        return value

    @field_validator("include")
    @classmethod
    def _include(cls, value: list[str] | None) -> list[str] | None:
        if value:
            raise ValueError(f"not supported: {value[0][:64]!r}; nothing more than the output is served")
        return value

    @field_validator("truncation")
    @classmethod
    def _truncation(cls, value: str | None) -> str | None:
        if value is not None and value != "disabled":
            raise ValueError(f"{value[:32]!r} is not served; 'disabled' (an input over the context is a 400)")
        return value

    def to_chat(self) -> ChatCompletionRequest:
        """The chat request this one is served as.

        Returns:
            A `ChatCompletionRequest` with the input as messages, the tools in chat's shape, one choice.
        Raises:
            InvalidArgument: an input item or tool field that is not served or malformed (named in
                the Responses shape), two tools of one name, a named `tool_choice` not among them.
        """
        chat: dict[str, Any] = {
            "model": self.model,
            "messages": self._messages(),
            "max_completion_tokens": self.max_output_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "user": self.user,
            "prompt_cache_key": self.prompt_cache_key,
            "parallel_tool_calls": self.parallel_tool_calls,
            "chat_template_kwargs": self.chat_template_kwargs,
            "seed": self.seed,
            "reasoning_effort": self.reasoning.effort if self.reasoning is not None else None,
            "stream": self.stream,
        }
        if self.text is not None and (response_format := self.text.chat_response_format()) is not None:
            chat["response_format"] = response_format
        if self.tools:
            chat["tools"] = self._chat_tools()
        if isinstance(self.tool_choice, dict):
            chat["tool_choice"] = {"type": "function", "function": {"name": self.tool_choice["name"]}}
        elif self.tool_choice is not None:
            chat["tool_choice"] = self.tool_choice
        try:
            return ChatCompletionRequest.model_validate(chat, strict=True)
        except ValidationError as err:  # fields passed through whole (chat_template_kwargs) keep their names
            raise validation_error(err) from err

    def _chat_tools(self) -> list[dict[str, Any]]:
        tools = self.tools or []
        names = [tool.name for tool in tools]
        for i, name in enumerate(names):
            if name in names[:i]:
                raise InvalidArgument(f"tools[{i}].name: {name!r} is given twice")
        if isinstance(self.tool_choice, dict) and self.tool_choice["name"] not in names:
            raise InvalidArgument(f"tool_choice.name: {self.tool_choice['name'][:64]!r} is not among the tools")
        return [{"type": "function", "function": t.model_dump(exclude={"type"}, exclude_none=True)} for t in tools]

    def _messages(self) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = []
        if self.instructions is not None:
            messages.append({"role": "system", "content": self.instructions})
        if isinstance(self.input, str):
            return [*messages, {"role": "user", "content": self.input}]
        reasoning: list[str] = []  # reasoning items waiting for the assistant message they belong to
        for i, raw in enumerate(self.input):
            item = _item(i, raw)
            if isinstance(item, _Reasoning):
                reasoning.append(item.text())
            elif isinstance(item, _FunctionCallOutput):
                content = _text(f"input[{i}].output", item.output)
                messages.append({"role": "tool", "tool_call_id": item.call_id, "content": content})
            elif isinstance(item, _FunctionCall):
                function = {"name": item.name, "arguments": item.arguments}
                call = {"id": item.call_id, "type": "function", "function": function}
                last = messages[-1] if messages else None
                if last is None or last["role"] != "assistant" or reasoning:
                    last = {"role": "assistant", "content": None, "tool_calls": []}
                    messages.append(_with_reasoning(last, reasoning))
                calls = last.setdefault("tool_calls", [])
                if len(calls) >= MAX_TOOL_CALLS:
                    raise InvalidArgument(f"input[{i}]: more than {MAX_TOOL_CALLS} calls in one assistant turn")
                calls.append(call)
            elif isinstance(item, _Message):
                message = {"role": item.role, "content": _text(f"input[{i}].content", item.content)}
                messages.append(_with_reasoning(message, reasoning) if item.role == "assistant" else message)
        return messages


def _item(i: int, raw: dict[str, Any]) -> Lenient:
    """Input item `i`, validated as its type (a message when it has a role and no type).

    Raises: InvalidArgument: an unknown or unserved item type, or a malformed item."""
    kind = raw.get("type", "message")
    model = _ITEMS.get(kind) if isinstance(kind, str) else None
    if model is None:
        served = ", ".join(_ITEMS)
        raise InvalidArgument(f"input[{i}].type: {str(kind)[:64]!r} is not served; items of type {served}")
    try:
        return model.model_validate(raw, strict=True)
    except ValidationError as err:
        raise validation_error(err, f"input[{i}]") from err


def _text(where: str, content: str | list[dict[str, Any]]) -> str:
    """Content as one string: a string, or text parts joined.

    Raises: InvalidArgument: a part that is not `input_text` / `output_text` (images, files)."""
    if isinstance(content, str):
        return content
    texts = []
    for j, part in enumerate(content):
        try:
            texts.append(_TextPart.model_validate(part, strict=True).text)
        except ValidationError as err:
            raise InvalidArgument(
                f"{where}[{j}]: only parts of type {' or '.join(TEXT_PARTS)} with a string 'text' are served"
            ) from err
    return "".join(texts)


def _with_reasoning(message: dict[str, Any], reasoning: list[str]) -> dict[str, Any]:
    """`message` (an assistant's) with the reasoning items before it as its `reasoning_content`."""
    if reasoning:
        message["reasoning_content"] = "\n".join(reasoning)
        reasoning.clear()
    return message


T = TypeVar("T")
# Chat's fields as the Responses API names them, for a refusal the chat path words.
RESPONSES_NAMES = {
    "reasoning_effort": "reasoning.effort",
    "response_format": "text.format",
    "max_completion_tokens": "max_output_tokens",
}


async def in_responses_terms(prepare: Awaitable[T]) -> T:
    """`prepare` (the chat path serving a Responses request), its refusals naming the Responses fields.

    Raises:
        InvalidArgument: as `prepare`, the leading chat field renamed (`RESPONSES_NAMES`).
        CalculetError: any other, as it came.
    """
    try:
        return await prepare
    except InvalidArgument as err:
        field, sep, rest = err.message.partition(":")
        if sep and field in RESPONSES_NAMES:
            raise InvalidArgument(f"{RESPONSES_NAMES[field]}:{rest}") from err
        raise
