"""`LoadPolicy` (`--routing load`): the load-only rule, without any prefix or prefill term, kept
so a benchmark can compare it with the TTFT rule side by side.

Load = (queued + running jobs) per lane (`BoardView.jobs / lanes`: other gateways' as the last
report had them, this gateway's as they are now). Among the candidates:
- with a session key, rendezvous hashing picks the same board for the same key while it has
  spare capacity (load < 1); when it is full the rule below applies rather than queueing there;
- otherwise the power of two choices: two candidates at random, the lower load wins (on a tie,
  the fewer of this gateway's jobs per lane). Nearly as good as least-loaded, and it does not
  stampede one board when reports are stale;
- except that a request never queues behind a full board while another has a free lane: when both
  sampled boards are full (load >= 1), the least loaded candidate is taken if it has room (at
  saturation the two choices alone miss the one board with a free lane half the time on 4 boards).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from calculet.gateway.routing.policy import RoutingPolicy, affinity
from calculet.gateway.routing.scoring.inputs import BoardView, RouteRequest


def load(board: BoardView) -> float:
    """Queued + running jobs per lane.

    Args:
        board: the candidate.
    Returns:
        The load (1.0 = every lane taken).
    """
    return board.jobs / max(1, board.lanes)


def _rank(board: BoardView) -> tuple[float, float]:
    """Lower is better: the load, then this gateway's own jobs per lane (exact, never stale)."""
    return load(board), board.own_jobs / max(1, board.lanes)


class LoadPolicy(RoutingPolicy):
    """The load-only rule (module docstring).

    Args:
        rng: randomness for the two choices (seeded in tests).
    """

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng or random.Random()

    def choose(self, request: RouteRequest, boards: Sequence[BoardView]) -> BoardView:
        if request.session:
            preferred = max(boards, key=lambda board: affinity(request.session, board.target))
            if load(preferred) < 1.0:
                return preferred
        if len(boards) == 1:
            return boards[0]
        best = min(self._rng.sample(list(boards), 2), key=_rank)
        if load(best) < 1.0:
            return best
        roomiest = min(self._rng.sample(list(boards), len(boards)), key=_rank)  # shuffled: ties split at random
        return roomiest if load(roomiest) < 1.0 else best

    def rank(self, request: RouteRequest, board: BoardView) -> float:
        del request
        return load(board)
