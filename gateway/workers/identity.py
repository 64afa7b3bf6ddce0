"""`WorkerIdentity`: what one worker of a `--workers N` gateway knows of itself and its siblings.

The supervisor creates a private run directory and binds one Unix socket per worker in it
(`worker_socket`); each worker serves HTTP on the shared listening socket and on its own private one.
A sibling's private socket is how a worker reaches that one worker (the shared socket reaches
whichever accepts first): `GET /metrics` on any worker gathers its siblings' metrics through them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

WORKER_HEADER = "x-calculet-worker"  # every response of a worker names it (its index)


def worker_socket(run_dir: Path, index: int) -> Path:
    """The private Unix socket of worker `index` in the supervisor's run directory."""
    return run_dir / f"worker-{index}.sock"


@dataclass(frozen=True)
class WorkerIdentity:
    """Attributes:
    index: this worker's index, 0 .. count - 1 (a restarted worker keeps its index).
    count: the workers of the gateway.
    run_dir: the supervisor's private directory holding every worker's socket.
    """

    index: int
    count: int
    run_dir: Path

    def socket_of(self, index: int) -> Path:
        """The private socket of worker `index` (this one or a sibling)."""
        return worker_socket(self.run_dir, index)

    @property
    def siblings(self) -> tuple[int, ...]:
        """The other workers' indexes."""
        return tuple(i for i in range(self.count) if i != self.index)
