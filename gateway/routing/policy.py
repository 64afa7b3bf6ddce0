"""`RoutingPolicy`: how the router chooses among the candidates that passed its filters.

Two policies, chosen by `--routing` (`RoutingMode`): `prefix` (`ttft_policy.TtftPolicy`, the
default: the lowest estimated time to first token, prefix reuse included) and `load`
(`load_policy.LoadPolicy`: the load-only rule of before, for side-by-side benchmarks). A policy
sees only plain data (`scoring.inputs`), never a `Board`, so it is tested without a fleet.
"""

from __future__ import annotations

import abc
import hashlib
from collections.abc import Sequence
from enum import Enum

from calculet.gateway.routing.scoring.inputs import BoardView, RouteRequest


class RoutingMode(Enum):
    """`--routing`: which policy picks boards."""

    PREFIX = "prefix"
    LOAD = "load"


class RoutingPolicy(abc.ABC):
    """Chooses one board among filtered candidates."""

    @abc.abstractmethod
    def choose(self, request: RouteRequest, boards: Sequence[BoardView]) -> BoardView:
        """The board for `request`.

        Args:
            request: the choice to place.
            boards: the candidates, not empty (serving the request's package, ready, not excluded).
        Returns:
            One of `boards`.
        """

    @abc.abstractmethod
    def rank(self, request: RouteRequest, board: BoardView) -> float:
        """How good `board` is for `request` by this policy's measure, lower is better, comparable
        across requests of different packages (the service picks a package with it in a rollout).

        Args:
            request: the choice.
            board: a candidate.
        Returns:
            The measure.
        """


def affinity(session: str, target: str) -> int:
    """Rendezvous hash of a session key and a board: the session's board is the candidate with the
    highest value, so it stays put while that board stays a candidate.

    Args:
        session: the affinity key.
        target: the board's address.
    Returns:
        A 64-bit value.
    """
    digest = hashlib.blake2b(f"{session}\x00{target}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")
