"""One turn of a conversation: what is sent (`TurnRequest`) and what came back (`TurnRecord`).

A `TurnRequest` carries the whole conversation so far as chat messages (system prompt, every
earlier user message and the answer streamed back for it, the new user message), the turn's
`max_tokens` and its index in the run (the sampling seed derives from it). A `TurnRecord` wraps the
`RequestRecord` the timing figures come from (`latency`, `summary`) with the answer's text (sent
back in the next turn) and the prompt tokens the server says it served from cache
(`usage.prompt_tokens_details.cached_tokens`; 0 when it does not say, and `cache_reported` False).
Nothing here computes a figure.
"""

from __future__ import annotations

from dataclasses import dataclass

from calculet.ops.bench.records import RequestRecord

SYSTEM, USER, ASSISTANT = "system", "user", "assistant"


@dataclass(frozen=True)
class TurnMessage:
    """One message of the conversation (OpenAI's `{"role", "content"}`)."""

    role: str
    content: str

    def as_dict(self) -> dict[str, str]:
        return {"role": self.role, "content": self.content}


@dataclass(frozen=True)
class TurnRequest:
    """One chat request of a conversation.

    Attributes:
        user: the user (0-based).
        turn: the turn (1-based); 0 for a warm-up chat.
        index: its position in the run (warm-up first); the sampling seed is `--seed` + index.
        messages: the conversation so far, the new user message last.
        max_tokens: the answer's tokens (exactly, with `ignore_eos`).
    """

    user: int
    turn: int
    index: int
    messages: tuple[TurnMessage, ...]
    max_tokens: int


@dataclass(frozen=True)
class TurnRecord:
    """What one turn measured (module docstring)."""

    user: int
    turn: int
    record: RequestRecord
    answer: str
    cached_tokens: int
    cache_reported: bool

    @property
    def ok(self) -> bool:
        return self.record.ok
