"""How much of a request's prompt a board already holds in KV (the prefix-reuse term's input).

A board's lanes advertise the chained block hashes of what they hold; the request's cached prefix
there is its longest run of block hashes, from block 0, found among them (64 tokens a block). At
least the last token is always prefilled (its logits start the completion), so the cached count
stays below the request's length.
"""

from __future__ import annotations

from calculet.client.prefix import BLOCK_TOKENS, cached_blocks
from calculet.gateway.fleet.scoring.inputs import BoardView, RouteRequest


def cached_tokens(request: RouteRequest, board: BoardView) -> int:
    """Tokens of `request` whose KV `board` holds: min(cached blocks * 64, tokens - 1), >= 0.

    Args:
        request: the choice.
        board: the candidate.
    Returns:
        The count.
    """
    if not board.prefix_hashes or request.tokens <= 1:
        return 0
    return min(cached_blocks(request.block_hashes, board.prefix_hashes) * BLOCK_TOKENS, request.tokens - 1)


def uncached_tokens(request: RouteRequest, board: BoardView) -> int:
    """Tokens `board` would have to prefill for `request` (its length less `cached_tokens`).

    Args:
        request: the choice.
        board: the candidate.
    Returns:
        The count, at least 1 for a non-empty request.
    """
    return request.tokens - cached_tokens(request, board)
