"""OpenAI request fields this gateway knows and does not serve: each is refused with a 400 that
names it, rather than silently ignored (an ignored `guided_json` would hand a client that asked
for JSON free text). The table in docs/gateway.md ("Request fields") lists every field:
honoured, honoured in part, accepted without effect, or refused. Fields nobody here knows stay
ignored (`lenient.Lenient`).

Each field's validator runs only when the field is present, so its message is the 400's.
"""

from __future__ import annotations

from typing import Any, get_args

from pydantic import field_validator

from calculet.gateway.api.lenient import Lenient
from calculet.gateway.api.structured import ResponseFormat

OLD_GUIDED = 'vLLM\'s older name; send `structured_outputs` (docs/gateway.md, "Structured outputs")'
SERVED_FORMATS: tuple[str, ...] = get_args(ResponseFormat.model_fields["type"].annotation)  # chat's, one list


def check_output_format(kind: Any) -> None:
    """The one check of an answer's requested format's type: the Responses API's `text.format` (chat's
    `response_format` is parsed whole by `structured.ResponseFormat`, which allows the same types).

    Args:
        kind: the format object's `type`.
    Raises:
        ValueError: `kind` is not a served format (the caller's validator names the field).
    """
    if kind not in SERVED_FORMATS:
        raise ValueError(f"type {str(kind)[:32]!r} is not supported; one of {', '.join(SERVED_FORMATS)}")


def refuse(why: str) -> Any:
    """A field validator refusing any value but null (`why` follows "not supported: ")."""

    def check(value: Any) -> Any:
        if value is not None:
            raise ValueError(f"not supported: {why}")
        return value

    return check


class SamplingRefusals(Lenient):
    """Refused in chat and text completions alike: OpenAI's `logit_bias`, and vLLM's older
    structured output fields (this gateway takes vLLM's names for its extensions, so a vLLM client's
    `guided_json` must not pass as free text; `structured_outputs` is served, `structured.py`)."""

    logit_bias: dict[str, Any] | None = None
    guided_json: Any = None
    guided_regex: Any = None
    guided_choice: Any = None
    guided_grammar: Any = None

    _guided_json = field_validator("guided_json")(refuse(OLD_GUIDED))
    _guided_regex = field_validator("guided_regex")(refuse(OLD_GUIDED))
    _guided_choice = field_validator("guided_choice")(refuse(OLD_GUIDED))
    _guided_grammar = field_validator("guided_grammar")(refuse(OLD_GUIDED))

    @field_validator("logit_bias")
    @classmethod
    def _logit_bias(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value:  # {} biases nothing
            raise ValueError("not supported: the boards' sampling takes no per-token bias")
        return value


class CompletionRefusals(Lenient):
    """Text completion fields refused: OpenAI's legacy completions have no `response_format`."""

    response_format: dict[str, Any] | None = None

    @field_validator("response_format")
    @classmethod
    def _response_format(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None and value.get("type") != "text":
            raise ValueError("chat completions only; send `structured_outputs` here")
        return value


class StorageRefusals(Lenient):
    """Refused in chat and in the Responses API alike: stored answers and service tiers that are
    not served, accepted only in the values that ask for nothing more than what is."""

    store: bool | None = None
    service_tier: str | None = None
    prompt_cache_retention: str | None = None

    @field_validator("store")
    @classmethod
    def _store(cls, value: bool | None) -> bool | None:
        if value:
            raise ValueError("not supported: answers are not stored")
        return value

    @field_validator("prompt_cache_retention")
    @classmethod
    def _retention(cls, value: str | None) -> str | None:
        if value is not None and value != "in_memory":
            raise ValueError(f"{value[:32]!r} is not served; 'in_memory' (a board keeps KV while its lane is parked)")
        return value

    @field_validator("service_tier")
    @classmethod
    def _service_tier(cls, value: str | None) -> str | None:
        if value is not None and value not in ("auto", "default"):
            raise ValueError(f"{value[:32]!r} is not served; 'auto' or 'default' (see the `priority` extension)")
        return value


class ChatRefusals(StorageRefusals):
    """Chat completion fields refused, or accepted only in the values that ask for nothing more
    than what is served."""

    modalities: list[str] | None = None
    audio: Any = None
    prediction: Any = None
    web_search_options: Any = None
    functions: Any = None
    function_call: Any = None
    verbosity: Any = None

    _audio = field_validator("audio")(refuse("audio output is not served (text only)"))
    _prediction = field_validator("prediction")(refuse("predicted outputs are not served"))
    _web = field_validator("web_search_options")(refuse("no web search here"))
    _functions = field_validator("functions")(refuse("deprecated by OpenAI; send `tools`"))
    _function_call = field_validator("function_call")(refuse("deprecated by OpenAI; send `tool_choice`"))
    _verbosity = field_validator("verbosity")(refuse("the answer's length is max_tokens' to bound"))

    @field_validator("modalities")
    @classmethod
    def _modalities(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and any(m != "text" for m in value):
            raise ValueError("only 'text' is served")
        return value
