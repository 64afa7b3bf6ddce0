"""The one map of model generations on a board, and which generation each alias serves.

A generation enters at Validating (`add`), may run jobs from Warming until it is fenced (`start_jobs`
/ `stop_jobs`), is published under its alias when Ready (`publish`) and leaves when unloaded
(`remove`). Everything that asks "which generations exist", "may this generation's job touch its
lanes" or "what does this alias serve" asks this table, so the three answers cannot disagree.

Owner: the `Engine`; guarded by the engine lock (this class is not thread-safe on its own). The
`ModelManager` changes it only through the engine's methods.
"""

from __future__ import annotations

from calculet.common.errors import NotFound, Unavailable
from calculet.daemon.core.runtime import ModelRuntime


class GenerationTable:
    """Every generation not yet unloaded, the running subset, and alias -> serving generation."""

    def __init__(self) -> None:
        self._all: dict[int, ModelRuntime] = {}
        self._running: set[int] = set()  # generations whose jobs may run (Warming .. fenced)
        self._published: dict[str, ModelRuntime] = {}
        self._known_aliases: set[str] = set()  # ever published: an unloaded one answers UNAVAILABLE

    # ---- changes ---------------------------------------------------------------------------

    def add(self, rt: ModelRuntime) -> None:
        self._all[rt.generation] = rt

    def start_jobs(self, rt: ModelRuntime) -> None:
        """Let jobs of this generation run (its warm-up included); publishing is separate."""
        self._all[rt.generation] = rt
        self._running.add(rt.generation)

    def stop_jobs(self, generation: int) -> None:
        """Fence the generation: a completion of its jobs no longer touches its lanes or buffers."""
        self._running.discard(generation)

    def remove(self, generation: int) -> None:
        self._running.discard(generation)
        self._all.pop(generation, None)

    def publish(self, rt: ModelRuntime) -> ModelRuntime | None:
        """Point the alias at `rt`. Returns the generation it replaced."""
        old = self._published.get(rt.alias)
        self._published[rt.alias] = rt
        self._known_aliases.add(rt.alias)
        return old

    def unpublish(self, alias: str, generation: int) -> None:
        """Drop the alias, unless a newer generation took it over already."""
        if (rt := self._published.get(alias)) is not None and rt.generation == generation:
            del self._published[alias]

    # ---- queries ---------------------------------------------------------------------------

    def running(self, generation: int) -> ModelRuntime | None:
        """The generation if its jobs may run (not fenced), else None."""
        return self._all.get(generation) if generation in self._running else None

    def runnable(self) -> dict[int, ModelRuntime]:
        """Running generations whose lanes exist, by number (what the scheduler may plan on)."""
        return {g: rt for g in self._running if (rt := self._all[g]).kv is not None}

    def published(self, alias: str) -> ModelRuntime | None:
        """The generation published under `alias` (any state), or None."""
        return self._published.get(alias)

    def serving_or_raise(self, alias: str) -> ModelRuntime:
        """The Ready generation a new request of `alias` runs on.

        Raises:
            NotFound: the alias was never published here.
            Unavailable: it was unloaded, or its generation is not serving (draining, failed).
        """
        rt = self._published.get(alias)
        if rt is None:
            if alias in self._known_aliases:
                raise Unavailable(f"model {alias!r} is not loaded on this board")
            raise NotFound(f"unknown model {alias!r}")
        if not rt.state.serving:
            raise Unavailable(f"model {alias!r} is {rt.state.value}")
        return rt

    def is_published(self, rt: ModelRuntime) -> bool:
        return self._published.get(rt.alias) is rt

    def all_published(self) -> list[ModelRuntime]:
        """Published generations, by alias."""
        return sorted(self._published.values(), key=lambda rt: rt.alias)

    def all(self) -> list[ModelRuntime]:
        """Every generation not yet unloaded, oldest first."""
        return sorted(self._all.values(), key=lambda rt: rt.generation)
