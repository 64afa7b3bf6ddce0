"""Table-driven lifecycles (DEVELOPERS.md rule 4).

Every lifecycle in the daemon (model states, job buffer states, lane states, reset states), the
client (clients, stream cursors) and the gateway (boards, placements) is an `Enum` plus a transition
table; `Lifecycle.move` is the one function that changes the state, and an edge missing from the table
raises `IllegalTransition`. Callers hold their own lock: this class does no locking so it can live
inside objects that already serialise access.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from enum import Enum
from typing import Generic, TypeVar

from calculet.common.errors import IllegalTransition

S = TypeVar("S", bound=Enum)

TransitionTable = Mapping[S, frozenset[S]]


def table(edges: Iterable[tuple[S, Iterable[S]]]) -> dict[S, frozenset[S]]:
    """Build a transition table from `(state, targets)` pairs."""
    return {src: frozenset(dsts) for src, dsts in edges}


class Lifecycle(Generic[S]):
    """The current state of one object and the table that governs it.

    Args:
        name: what this lifecycle belongs to, for error messages (e.g. "model tiny gen 3").
        initial: the starting state.
        transitions: allowed edges; states absent as keys are terminal.
        on_change: called as `on_change(old, new)` after every successful move.
    """

    def __init__(
        self,
        name: str,
        initial: S,
        transitions: Mapping[S, frozenset[S]],
        on_change: Callable[[S, S], None] | None = None,
    ) -> None:
        self.name = name
        self._state = initial
        self._transitions = transitions
        self._on_change = on_change

    @property
    def state(self) -> S:
        return self._state

    def can_move(self, target: S) -> bool:
        return target in self._transitions.get(self._state, frozenset())

    def move(self, target: S) -> S:
        """Move to `target` and return the previous state.

        Raises:
            IllegalTransition: the table has no edge from the current state to `target`.
        """
        if not self.can_move(target):
            raise IllegalTransition(f"{self.name}: illegal transition {self._state.name} -> {target.name}")
        old, self._state = self._state, target
        if self._on_change is not None:
            self._on_change(old, target)
        return old

    def __repr__(self) -> str:
        return f"Lifecycle({self.name!r}, {self._state.name})"
