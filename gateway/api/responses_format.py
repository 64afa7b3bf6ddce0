"""The Responses API's objects as plain dicts: the `response` object, its output items and usage,
in the shapes of OpenAI's API reference (and of the `openai` package's `types/responses`). No I/O.

Item ids: `rs_` (reasoning), `msg_` (message), `fc_` (function call) and 24 hex digits; a call's
`call_id` is the chat path's call id (`call_` + 24 hex digits).
"""

from __future__ import annotations

import secrets
from typing import Any

from calculet.gateway.api.responses_schema import ResponsesRequest


def item_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


def reasoning_item(rid: str, text: str, status: str) -> dict[str, Any]:
    """A reasoning item: the think block's text as its one `reasoning_text` content part (no summary:
    none is made)."""
    content = [{"type": "reasoning_text", "text": text}] if text else []
    return {"id": rid, "type": "reasoning", "summary": [], "content": content, "status": status}


def output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def message_item(mid: str, text: str | None, status: str) -> dict[str, Any]:
    """An assistant message item (`text` None: without its content part yet, as when it is added)."""
    content = [] if text is None else [output_text(text)]
    return {"id": mid, "type": "message", "role": "assistant", "status": status, "content": content}


def function_call_item(fid: str, call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {
        "id": fid,
        "type": "function_call",
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


def usage(input_tokens: int, cached_tokens: int, output_tokens: int, reasoning_tokens: int) -> dict[str, Any]:
    """The Responses API's usage object.

    Args:
        input_tokens: the prompt's tokens.
        cached_tokens: of them, those the board served from KV.
        output_tokens: the answer's tokens, reasoning included.
        reasoning_tokens: of them, those of the think block.
    """
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": cached_tokens},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
        "total_tokens": input_tokens + output_tokens,
    }


def response_object(
    rid: str,
    created_at: int,
    model: str,
    req: ResponsesRequest,
    *,
    status: str,
    output: list[dict[str, Any]],
    used: dict[str, Any] | None,
) -> dict[str, Any]:
    """The `response` object: the request's settings echoed, `status` in_progress, completed or
    incomplete (then `incomplete_details.reason` is max_output_tokens: the answer was cut by length).

    Args:
        rid: `resp_` and hex digits.
        created_at: Unix seconds.
        model: the model that answers.
        req: the request.
        status: the response's status.
        output: its output items so far.
        used: its usage (None while in progress).
    """
    tool_choice = req.tool_choice if req.tool_choice is not None else ("auto" if req.tools else "none")
    return {
        "id": rid,
        "object": "response",
        "created_at": created_at,
        "status": status,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "model": model,
        "output": output,
        "parallel_tool_calls": req.parallel_tool_calls,
        "previous_response_id": None,
        "reasoning": {"effort": None, "summary": None},
        "store": False,
        "temperature": req.temperature,
        "text": {"format": {"type": "text"}},
        "tool_choice": tool_choice,
        "tools": [tool.model_dump() for tool in req.tools or []],
        "top_p": req.top_p,
        "truncation": "disabled",
        "usage": used,
        "user": req.user,
        "metadata": req.metadata or {},
    }
