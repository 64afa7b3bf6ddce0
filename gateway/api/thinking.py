"""A chat request's bound on thinking, as the board's `ThinkingBudget` (docs/gateway.md "Tools and
reasoning"; the board forces the close, docs/daemon.md "Thinking budget").

`thinking_token_budget` (vLLM's name) gives the tokens the think block may hold; `reasoning_effort`
(OpenAI's: low, medium, high) picks one of the gateway's budgets per effort (`--thinking-budgets`);
the explicit budget wins when both are given. The markers are the model's own tokens, looked up by
text in the package's tokenizer: a model without them cannot be bounded, and a request that asks is
a 400 naming its field.

A constrained answer (structured outputs, tool calls) that asks no bound still thinks freely: it gets
an unbounded budget, which only tells the board the markers, so the constraint applies after the
think block rather than forbidding it (as vLLM applies a grammar after its reasoning parser's end).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping

from calculet.client import ThinkingBudget
from calculet.common.errors import InvalidArgument

EFFORTS = ("low", "medium", "high")
# Tokens of thinking per effort: Qwen3 thinks for hundreds to thousands of tokens; at a board's ~58
# tokens/s per stream these bound the wait before the answer to about 9 s, 35 s and 2.4 min.
DEFAULT_BUDGETS: Mapping[str, int] = {"low": 512, "medium": 2048, "high": 8192}
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
MAX_BUDGET = 2**31 - 1


def thinking_budget(
    budget: int | None,
    effort: str | None,
    budgets: Mapping[str, int],
    token_id: Callable[[str], int | None],
) -> ThinkingBudget | None:
    """The board's budget for a request, or None (nothing asked).

    Args:
        budget: the request's `thinking_token_budget`.
        effort: its `reasoning_effort` (one of `EFFORTS`, checked by the schema).
        budgets: the gateway's budget per effort.
        token_id: the package tokenizer's id of a token's text (None: no such token).
    Raises:
        InvalidArgument: a budget is asked of a model whose tokenizer has no think markers.
    """
    if budget is None and effort is None:
        return None
    field = "thinking_token_budget" if budget is not None else "reasoning_effort"
    tokens = budget if budget is not None else budgets[effort or ""]
    opening, closing = token_id(THINK_OPEN), token_id(THINK_CLOSE)
    if opening is None or closing is None:
        raise InvalidArgument(f"{field}: this model's tokenizer has no {THINK_OPEN} / {THINK_CLOSE} tokens to bound")
    return ThinkingBudget(tokens, open_token_id=opening, close_token_id=closing)


def free_thinking(token_id: Callable[[str], int | None], stop_ids: Collection[int]) -> ThinkingBudget | None:
    """An unbounded budget that lets a constrained answer think first (module docstring), or None
    when the model has no think markers or the request stops at one (the board refuses a marker
    that is a stop token).

    Args:
        token_id: the package tokenizer's id of a token's text (None: no such token).
        stop_ids: the request's stop token ids.
    """
    opening, closing = token_id(THINK_OPEN), token_id(THINK_CLOSE)
    if opening is None or closing is None or opening in stop_ids or closing in stop_ids:
        return None
    return ThinkingBudget(MAX_BUDGET, open_token_id=opening, close_token_id=closing)
