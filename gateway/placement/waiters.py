"""Requests waiting for a model that no board serves yet: one bounded queue per catalog model.

Owns the count of waiters per alias and the bounds on them. A request that finds no board for a
catalog model (placement by demand on) `enter`s its model's queue, or is refused at once with 429
and `Retry-After` when the queue is full; it stays until a board serves the model, its deadline
passes (503 with `Retry-After`), placement refuses the model, or the client leaves (the request's
task is cancelled: the `with` block ends and the waiter is gone). The placement loop reads
`count` as demand and hears every change through `on_change`, so a switch whose waiters all left
is not started.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from calculet.common.errors import InvalidArgument, Overloaded

MAX_QUEUE = 100_000


@dataclass(frozen=True)
class QueueBounds:
    """Attributes: max_waiting (per model), wait_s (how long one request may wait for a board)."""

    max_waiting: int = 64
    wait_s: float = 120.0

    def __post_init__(self) -> None:
        if not 1 <= self.max_waiting <= MAX_QUEUE:
            raise InvalidArgument(f"placement queue: must be 1..{MAX_QUEUE}, got {self.max_waiting}")
        if not 0 < self.wait_s <= 3600:
            raise InvalidArgument(f"placement wait: must be in (0, 3600] seconds, got {self.wait_s}")


class ModelWaiters:
    """The per-model queues (module docstring).

    Args:
        bounds: queue length and wait.
        on_change: called after every enter and leave (the placement loop's wake-up).
    """

    def __init__(self, bounds: QueueBounds, on_change: Callable[[], None] = lambda: None) -> None:
        self.bounds = bounds
        self._on_change = on_change
        self._waiting: dict[str, int] = {}

    def count(self, alias: str) -> int:
        return self._waiting.get(alias, 0)

    def counts(self) -> dict[str, int]:
        return {alias: n for alias, n in self._waiting.items() if n}

    @contextmanager
    def enter(self, alias: str) -> Iterator[None]:
        """Wait in `alias`'s queue for the `with` block.

        Raises:
            Overloaded: the queue is full (429; Retry-After: the wait bound, a switch's worth).
        """
        if self.count(alias) >= self.bounds.max_waiting:
            raise Overloaded(
                f"model {alias!r} is being placed on a board and {self.count(alias)} request(s) already wait for it",
                retry_after_s=min(self.bounds.wait_s, 30.0),
            )
        self._waiting[alias] = self.count(alias) + 1
        self._on_change()
        try:
            yield
        finally:
            self._waiting[alias] -= 1
            self._on_change()
