"""`Router`: which board gets the next request (DESIGN.md section 7).

Only boards where the model is Ready on a SERVING, reachable daemon are candidates. Among them:
- with a session key (the request's `user` or `x-session-id` header): rendezvous hashing picks
  the same board for the same key while it stays a candidate and has spare capacity (load < 1:
  fewer queued + running jobs than lanes), so a session's prefix can be reused there; when that
  board is full the request falls back to the rule below rather than queueing behind it;
- otherwise the power of two choices: two candidates at random, the one with the lower load
  (queued + running per lane, counting jobs this gateway placed since the last report). It is
  nearly as good as least-loaded and does not stampede one board when reports are stale.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Collection

from calculet.gateway.fleet.board import Board
from calculet.gateway.fleet.fleet import Fleet


class Router:
    """Picks boards for requests.

    Args:
        fleet: the boards.
        rng: randomness for the two choices (seeded in tests).
    """

    def __init__(self, fleet: Fleet, rng: random.Random | None = None) -> None:
        self._fleet = fleet
        self._rng = rng or random.Random()

    def candidates(self, alias: str, exclude: Collection[str] = ()) -> list[Board]:
        return [b for b in self._fleet.serving(alias) if b.target not in exclude]

    def pick(self, alias: str, *, exclude: Collection[str] = (), session: str = "") -> Board | None:
        """A board for one request of `alias`, or None when no candidate is left."""
        boards = self.candidates(alias, exclude)
        if not boards:
            return None
        if session:
            preferred = max(boards, key=lambda b: _affinity(session, b.target))
            if preferred.load(alias) < 1.0:
                return preferred
        if len(boards) == 1:
            return boards[0]
        a, b = self._rng.sample(boards, 2)
        return a if a.load(alias) <= b.load(alias) else b


def _affinity(session: str, target: str) -> int:
    digest = hashlib.blake2b(f"{session}\x00{target}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")
