"""What the scorers read: `RouteRequest` (one choice to place) and `BoardView` (one candidate).

Data flow: the service tokenizes a prompt once per package and builds a `RouteRequest` from its
tokens (their chained 64-token block hashes, `calculet.common.prefix`); the router turns each
candidate `Board` into a `BoardView` (plain numbers, a snapshot) and hands both to the scorers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from calculet.common.prefix import block_hashes


@dataclass(frozen=True)
class RouteRequest:
    """One choice the router must place.

    Attributes:
        alias: the model.
        package_hash: the package its tokens come from: only boards serving it qualify.
        tokens: tokens the board must hold before the choice's next token (the prompt; on a
            failover, the prompt and the tokens already streamed). At least 1.
        block_hashes: chained hashes of their full blocks, from block 0.
        session: affinity key ("" = none): breaks near-ties.
    """

    alias: str
    package_hash: str
    tokens: int
    block_hashes: tuple[int, ...]
    session: str = ""

    @classmethod
    def build(cls, alias: str, package_hash: str, tokens: Sequence[int], session: str = "") -> RouteRequest:
        """The request for a choice whose board must hold `tokens`.

        Args:
            alias / package_hash / session: as the attributes.
            tokens: the token ids.
        Returns:
            The request, its block hashes computed here (one BLAKE2b per 64 tokens).
        """
        return cls(alias, package_hash, len(tokens), tuple(block_hashes(tokens)), session)

    def continued(self, tokens: Sequence[int]) -> RouteRequest:
        """The same choice after some tokens were streamed (a failover resubmits them).

        Args:
            tokens: this request's tokens followed by the streamed ones.
        Returns:
            A request over all of `tokens`; the full blocks hashed already are reused.
        """
        known = len(self.block_hashes)
        prev = self.block_hashes[-1] if known else 0
        more = block_hashes(tokens, start=known, prev=prev)
        return RouteRequest(self.alias, self.package_hash, len(tokens), self.block_hashes + tuple(more), self.session)


@dataclass(frozen=True)
class BoardView:
    """One candidate board as the scorers see it: a snapshot of plain numbers.

    "Others" are what the board's last load report counted beyond this gateway's own work at the
    time the report arrived (floored at 0): other gateways' work, as of that report.

    Attributes:
        target: the board's address (session affinity hashes it).
        lanes: KV lanes of the model there (at least 1).
        jobs: queued + running jobs there: others' + this gateway's now.
        own_jobs: this gateway's jobs there now.
        pending_tokens: prompt tokens still to prefill there before a new prompt: others' + this
            gateway's placements that have not received their first token.
        prefix_hashes: the block hashes its lanes hold (last report; empty without prefix reuse).
        prefix_tips: each lane's last block hash (last report; empty from a daemon that sends none).
        cold_lanes: lanes neither held by a job nor parked (a stranger's prompt is prefilled there).
        pending_short_tokens: of `pending_tokens`, short prefills' (the daemon serves them first).
        short_tokens: the daemon's short-prefill bound (0: not reported).
        fixed_ms / per_token_ms: the package's prefill cost: n tokens take fixed + n * per_token.
        turnover_ms: how long a lane stays taken (this gateway's recent choice durations).
    """

    target: str
    lanes: int
    jobs: int
    own_jobs: int
    pending_tokens: int
    prefix_hashes: frozenset[int]
    fixed_ms: float
    per_token_ms: float
    turnover_ms: float
    prefix_tips: frozenset[int] = frozenset()
    cold_lanes: int = 0
    pending_short_tokens: int = 0
    short_tokens: int = 0


Scorer = Callable[[RouteRequest, BoardView], float]
"""A scorer: (request, board) -> estimated milliseconds; pure."""
