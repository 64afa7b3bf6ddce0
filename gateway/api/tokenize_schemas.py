"""Bodies of `POST /tokenize` and `POST /detokenize`, vLLM's shapes (docs/gateway.md "Tokenize")."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, model_validator

from calculet.gateway.api.lenient import Lenient
from calculet.gateway.api.schemas import MAX_MESSAGES, ChatMessage
from calculet.gateway.api.tool_schemas import MAX_TOOLS, Tool


class TokenizeRequest(Lenient):
    """A text (`prompt`) or a conversation (`messages`, rendered as a chat request renders it)."""

    model: Annotated[str, Field(min_length=1, max_length=128)]
    prompt: str | None = None
    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=MAX_MESSAGES)] | None = None
    add_generation_prompt: bool = True
    tools: Annotated[list[Tool], Field(max_length=MAX_TOOLS)] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    return_token_strs: bool = False

    @model_validator(mode="after")
    def _one_input(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of prompt and messages")
        return self


class DetokenizeRequest(Lenient):
    model: Annotated[str, Field(min_length=1, max_length=128)]
    tokens: list[Annotated[int, Field(ge=0)]]
