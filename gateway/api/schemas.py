"""OpenAI request bodies, parsed strictly: unknown fields are ignored, wrong types are 400.

Bodies are validated from the raw JSON with pydantic in strict mode (`parse_body`), so `"5"` is
not taken for 5 and `true` not for 1, as OpenAI's own API does; a pydantic `ValidationError` or a
body that is not JSON becomes `InvalidArgument` naming the field, which the one error mapping
turns into a 400 in OpenAI's shape (never FastAPI's 422). Fields OpenAI defines that are not served are
400s too (`refused_fields.py`, docs/gateway.md "Request fields"). Ranges follow OpenAI where OpenAI has
them and the daemon's protocol (inference.proto) for the extensions.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

from pydantic import Field, ValidationError, field_validator, model_validator

from calculet.client import Constraint
from calculet.common.errors import InvalidArgument
from calculet.gateway.api.lenient import Lenient
from calculet.gateway.api.refused_fields import ChatRefusals, CompletionRefusals, SamplingRefusals
from calculet.gateway.api.structured import ResponseFormat, StructuredFields
from calculet.gateway.api.thinking import MAX_BUDGET
from calculet.gateway.api.tool_grammar import TEXT_TAGS, CallTags, tool_call_constraint
from calculet.gateway.api.tool_schemas import MAX_TOOLS, Tool, ToolCall, ToolChoice, tools_for_template

MAX_N = 16
# Messages in one chat request: each costs the template a few tokens, so a conversation this long
# already fills any context we serve; past it the request is refused before it is rendered.
MAX_MESSAGES = 4096
# Prompts in one /v1/completions request (OpenAI's own bound for a list of prompts).
MAX_PROMPTS = 2048
# Chat roles, as OpenAI's API names them; `developer` is OpenAI's newer name for `system`.
ROLES = ("system", "developer", "user", "assistant", "tool")
MAX_STOPS = 16
MAX_TOOL_CALLS = 128  # calls in one assistant message of the history
MAX_TOP_LOGPROBS = 20
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1


class StreamOptions(Lenient):
    include_usage: bool = False


class _Sampling(SamplingRefusals, StructuredFields):
    """Fields shared by chat and text completions (and the refusals they share)."""

    model: Annotated[str, Field(min_length=1, max_length=128)]
    max_tokens: Annotated[int, Field(ge=1, le=2**32 - 1)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    n: Annotated[int, Field(ge=1, le=MAX_N)] = 1
    seed: Annotated[int, Field(ge=SEED_MIN, le=SEED_MAX)] | None = None
    stop: str | Annotated[list[str], Field(max_length=MAX_STOPS)] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] = 0.0
    frequency_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] = 0.0
    user: Annotated[str, Field(max_length=256)] | None = None
    # Extensions (vLLM's names).
    top_k: Annotated[int, Field(ge=-1)] | None = None  # -1 or 0 = disabled
    min_p: Annotated[float, Field(ge=0.0, le=1.0)] = 0.0
    repetition_penalty: Annotated[float, Field(gt=0.0)] | None = None
    priority: Annotated[int, Field(ge=-1000, le=1000)] = 0
    ignore_eos: bool = False
    stop_token_ids: Annotated[list[Annotated[int, Field(ge=0)]], Field(max_length=64)] | None = None

    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class TextPart(Lenient):
    type: Literal["text"]
    text: str


class ChatMessage(Lenient):
    role: str
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: Annotated[list[ToolCall], Field(max_length=MAX_TOOL_CALLS)] | None = None  # assistant
    tool_call_id: Annotated[str, Field(min_length=1, max_length=256)] | None = None  # tool
    reasoning_content: str | None = None  # assistant (llama.cpp's and vLLM's name)

    @field_validator("role")
    @classmethod
    def _known_role(cls, role: str) -> str:
        if role not in ROLES:
            raise ValueError(f"unknown role {role[:64]!r}; expected one of {', '.join(ROLES)}")
        return role

    @model_validator(mode="after")
    def _fields_of_role(self) -> ChatMessage:
        if self.tool_calls and self.role != "assistant":
            raise ValueError("tool_calls: only assistant messages make tool calls")
        if self.reasoning_content is not None and self.role != "assistant":
            raise ValueError("reasoning_content: only assistant messages have it")
        if self.tool_call_id is not None and self.role != "tool":
            raise ValueError("tool_call_id: only tool messages answer a call")
        return self

    def template_view(self) -> dict[str, Any]:
        """The message as the chat template sees it: content as one string.

        Raises:
            InvalidArgument: a content part that is not text (images are not served).
        """
        content = self.content
        if isinstance(content, list):
            texts = []
            for i, part in enumerate(content):
                try:
                    texts.append(TextPart.model_validate(part, strict=False).text)
                except ValidationError as err:
                    raise InvalidArgument(
                        f"content[{i}]: only parts of type 'text' with a string 'text' are supported"
                    ) from err
            content = "".join(texts)
        role = "system" if self.role == "developer" else self.role  # templates know `system`
        view: dict[str, Any] = {"role": role, "content": content if content is not None else ""}
        if self.name is not None:
            view["name"] = self.name
        if self.tool_calls:
            view["tool_calls"] = [call.model_dump() for call in self.tool_calls]
        if self.tool_call_id is not None:
            view["tool_call_id"] = self.tool_call_id
        if self.reasoning_content:
            view["reasoning_content"] = self.reasoning_content
        return view


class ChatCompletionRequest(_Sampling, ChatRefusals):
    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=MAX_MESSAGES)]
    max_completion_tokens: Annotated[int, Field(ge=1, le=2**32 - 1)] | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    add_generation_prompt: bool = True
    tools: Annotated[list[Tool], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool = True
    chat_template_kwargs: dict[str, Any] | None = None  # vLLM's name: extra template variables
    # Accepted without effect on the answer: the affinity key (`prompt_cache_key`, like `user`),
    # tags of stored answers (none are stored), an end user's id.
    prompt_cache_key: Annotated[str, Field(max_length=256)] | None = None
    metadata: dict[str, str] | None = None
    safety_identifier: Annotated[str, Field(max_length=256)] | None = None
    response_format: ResponseFormat | None = None
    reasoning_effort: Literal["low", "medium", "high"] | None = None
    thinking_token_budget: Annotated[int, Field(ge=0, le=MAX_BUDGET)] | None = None  # vLLM's name

    def answer_constraint(self, tags: CallTags = TEXT_TAGS) -> Constraint | None:
        """What the answer must match, or None: `response_format` or `structured_outputs`; or,
        with tools (unless `tool_choice` is `none`), the calls of the offered functions: only calls
        when `tool_choice` is `required` or names one, free text then calls under `auto`
        (`tool_grammar.py`; `tags`: its terms for the block's tags, `tool_grammar.call_tags`).

        Raises:
            InvalidArgument: both `response_format` and `structured_outputs`, or either with tools
                offered (the answer could then never be a call).
        """
        constraint = self.constraint(self.response_format)
        offered = bool(self.tools) and self.tool_choice != "none"
        if constraint is not None and offered:
            raise InvalidArgument("response_format: not served together with tools (unless tool_choice is 'none')")
        if offered:
            return tool_call_constraint(self.tools, self.tool_choice, self.parallel_tool_calls, tags)
        return constraint

    @field_validator("chat_template_kwargs")
    @classmethod
    def _thinking_is_bool(cls, kwargs: dict[str, Any] | None) -> dict[str, Any] | None:
        if kwargs is not None and "enable_thinking" in kwargs and not isinstance(kwargs["enable_thinking"], bool):
            raise ValueError("enable_thinking must be true or false")
        return kwargs

    def template_tools(self) -> tuple[list[dict[str, Any]] | None, bool]:
        """The tools the template is given and whether answers are parsed for tool calls
        (`tool_schemas.tools_for_template`). Raises: InvalidArgument."""
        return tools_for_template(self.tools, self.tool_choice)

    def token_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def logprobs_count(self) -> int | None:
        """Daemon `SamplingParams.logprobs`: None = none, 0 = the sampled token's only."""
        if not self.logprobs:
            if self.top_logprobs:
                raise InvalidArgument("top_logprobs: requires logprobs = true")
            return None
        return self.top_logprobs or 0


class CompletionRequest(_Sampling, CompletionRefusals):
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    echo: bool = False
    suffix: str | None = None
    best_of: Annotated[int, Field(ge=1, le=MAX_N)] | None = None

    def answer_constraint(self, tags: CallTags = TEXT_TAGS) -> Constraint | None:
        """What each completion must match (`structured_outputs`), or None (`tags`: unused, as
        completions take no tools)."""
        return self.constraint()

    def token_limit(self) -> int | None:
        # OpenAI's legacy default is 16 tokens.
        return 16 if self.max_tokens is None else self.max_tokens

    def logprobs_count(self) -> int | None:
        return self.logprobs

    def prompts(self) -> list[str | list[int]]:
        """The prompts, each a text or a list of token ids.

        Raises:
            InvalidArgument: an empty prompt list, or options this gateway does not serve.
        """
        if self.echo:
            raise InvalidArgument("echo: not supported")
        if self.suffix:
            raise InvalidArgument("suffix: not supported")
        if self.best_of is not None and self.best_of != self.n:
            raise InvalidArgument("best_of: only best_of = n is supported")
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if not p:
            raise InvalidArgument("prompt: must not be empty")
        if len(p) > MAX_PROMPTS and not all(isinstance(x, int) for x in p):
            raise InvalidArgument(f"prompt: {len(p)} prompts; at most {MAX_PROMPTS} in one request")
        if all(isinstance(x, int) for x in p):
            return [list(p)]  # type: ignore[arg-type]
        return list(p)  # type: ignore[arg-type]


Body = TypeVar("Body", bound=Lenient)


def parse_body(cls: type[Body], raw: bytes) -> Body:
    """Validate a JSON request body.

    Raises:
        InvalidArgument: not JSON, not an object, a missing field, a wrong type or a value out of
            range (the message names the first offending field).
    """
    try:
        return cls.model_validate_json(raw, strict=True)
    except ValidationError as err:
        if err.errors()[0]["type"] == "json_invalid":
            raise InvalidArgument(f"body: not valid JSON ({err.errors()[0]['msg']})") from err
        raise validation_error(err) from err


def validation_error(err: ValidationError, prefix: str = "") -> InvalidArgument:
    """`err` as the 400 naming its first offending field (`prefix` before its path, if given)."""
    first = err.errors()[0]
    where = ".".join([prefix, *(str(p) for p in first["loc"])] if prefix else [str(p) for p in first["loc"]])
    return InvalidArgument(f"{where or 'body'}: {first['msg']}")
