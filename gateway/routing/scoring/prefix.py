"""How much of a request's prompt a board already holds in KV (the prefix-reuse term's input).

A board's lanes advertise the chained block hashes of what they hold; the request's cached prefix
there is its longest run of block hashes, from block 0, found among them (64 tokens a block). At
least the last token is always prefilled (its logits start the completion), so the cached count
stays below the request's length.

The daemon reuses a lane only in two cases (docs/daemon.md, "Conversations"), and so does this
estimate: the request *continues* a lane (its hashes contain that lane's tip, the lane's last full
block: its next turn), or it shares a shorter prefix (a system prompt) and the board has no cold lane
left, so its least recently used parked lane is taken and keeps what it shares (counted as the
shared run: an estimate, since the report does not say which lane that is; when the lanes hold one
system prompt, as they usually do, it is exact for that prefix). A stranger that only shares a prefix with a board's
conversations is prefilled cold there while a lane is free: no saving is counted. A tip among the
request's hashes also proves the lane holds every block before it, advertised or not. A daemon that
sends no tips (before lane tips) gets the plain run.
"""

from __future__ import annotations

from calculet.common.prefix import BLOCK_TOKENS, cached_blocks
from calculet.gateway.routing.scoring.inputs import BoardView, RouteRequest


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
    blocks = cached_blocks(request.block_hashes, board.prefix_hashes)
    if board.prefix_tips:
        through_tip = max((i + 1 for i, h in enumerate(request.block_hashes) if h in board.prefix_tips), default=0)
        if through_tip:
            blocks = max(blocks, through_tip)  # continues a lane
        elif board.cold_lanes > 0:
            blocks = 0  # only a shared prefix: the daemon prefills it cold on a free lane
    return min(blocks * BLOCK_TOKENS, request.tokens - 1)


def uncached_tokens(request: RouteRequest, board: BoardView) -> int:
    """Tokens `board` would have to prefill for `request` (its length less `cached_tokens`).

    Args:
        request: the choice.
        board: the candidate.
    Returns:
        The count, at least 1 for a non-empty request.
    """
    return request.tokens - cached_tokens(request, board)
