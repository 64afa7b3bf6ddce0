"""`Router`: which board gets the next request (DESIGN.md section 7).

Only boards where the model is Ready on a SERVING, reachable daemon are candidates. Among them:
- with a session key (the request's `user` or `x-session-id` header): rendezvous hashing picks
  the same board for the same key while it stays a candidate and has spare capacity (load < 1:
  fewer queued + running jobs than lanes), so a session's prefix can be reused there; when that
  board is full the request falls back to the rule below rather than queueing behind it;
- otherwise the power of two choices: two candidates at random, the one with the lower load
  (`Board.load`: queued + running per lane, this gateway's own jobs counted as they are now, other
  gateways' as the last report had them; on a tie, the fewer jobs of this gateway). It is nearly as
  good as least-loaded and does not stampede one board when reports are stale;
- except that a request never queues behind a full board while another has a free lane: when
  both sampled boards are full (load >= 1), the least loaded candidate is taken if it has room.
  At saturation (closed loop, clients = lanes of the fleet) the two choices alone miss the one
  board with a free lane half the time on 4 boards, and the request waits a whole request there.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Collection

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
        rank = _ranking(alias)
        best = min(self._rng.sample(boards, 2), key=rank)
        if best.load(alias) < 1.0:
            return best
        roomiest = min(self._rng.sample(boards, len(boards)), key=rank)  # shuffled: ties split at random
        return roomiest if roomiest.load(alias) < 1.0 else best


def _ranking(alias: str) -> Callable[[Board], tuple[float, float]]:
    """Lower is better: the load, then this gateway's own jobs per lane."""
    return lambda board: (board.load(alias), board.placed_load(alias))


def _affinity(session: str, target: str) -> int:
    digest = hashlib.blake2b(f"{session}\x00{target}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")
