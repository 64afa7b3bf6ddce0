"""The oracle: each pool request's answer from the clean reference fleet, computed once.

`ReferenceBook.fill(pool, client, model)` sends every spec's request exactly as the soak will
(`RequestSpec.body`: same messages, `n`, `seed`, `temperature`, `stream`), one at a time, read to
the end, to the reference fleet's gateway (one board, no faults, time scale 0). A conversation is
sent turn after turn, each turn carrying the reference's own earlier answers, as the soak's will
when its answers are right. The texts are cached in a JSON file keyed by the SHA-256 of the
request body, so a second run with the same pool (same seed, preset, size) asks nothing.

Data flow: `mix.build_pool` -> `ReferenceBook.fill` -> `ReferenceBook.answers(spec)` -> `classify`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import openai

from calculet.common.errors import FailedPrecondition
from calculet.ops.soak.exchange import send
from calculet.ops.soak.mix import RequestSpec

REFERENCE_TIMEOUT_S = 600.0  # one reference request on an idle, undisturbed board
CACHE_SCHEMA = "calculet.soak-references/1"


def body_key(body: dict[str, Any]) -> str:
    """The cache key of a request: SHA-256 of its canonical JSON."""
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


class ReferenceBook:
    """Per spec, per turn, per choice: the reference text (module docstring).

    Args:
        cache_path: the JSON cache (read if present, written by `save`); None = no cache.
    """

    def __init__(self, cache_path: Path | None = None) -> None:
        self._cache_path = cache_path
        self._cache: dict[str, list[str]] = {}
        self._answers: dict[str, tuple[tuple[str, ...], ...]] = {}
        self.asked = 0  # requests sent to the reference fleet (the others came from the cache)
        if cache_path is not None and cache_path.exists():
            raw = json.loads(cache_path.read_text(encoding="utf-8"))
            if raw.get("schema") == CACHE_SCHEMA:
                self._cache = {k: list(v) for k, v in raw.get("answers", {}).items()}

    def missing(self, pool: Sequence[RequestSpec], model: str) -> int:
        """Requests of `pool` the cache cannot answer (a conversation's later turns are counted
        only when its earlier ones are cached)."""
        missing = 0
        for spec in pool:
            answers: tuple[str, ...] = ()
            for turn in range(spec.turns):
                texts = self._cache.get(body_key(spec.body(model, turn, answers)))
                if texts is None:
                    missing += spec.turns - turn
                    break
                answers += (texts[0],)
        return missing

    async def fill(
        self,
        pool: Sequence[RequestSpec],
        client: openai.AsyncOpenAI | None,
        model: str,
        progress: Callable[[int, int], None] | None = None,
    ) -> None:
        """Find every spec's answers, asking `client` (the reference gateway) for what the cache lacks.

        Raises:
            FailedPrecondition: a reference request failed or came back incomplete (the reference
                fleet must answer every request), or one is missing and there is no client.
        """
        for done, spec in enumerate(pool, start=1):
            turns: list[tuple[str, ...]] = []
            for turn in range(spec.turns):
                body = spec.body(model, turn, tuple(t[0] for t in turns))
                turns.append(await self._answer(body, client, spec.key, turn))
            self._answers[spec.key] = tuple(turns)
            if progress is not None:
                progress(done, len(pool))

    async def _answer(
        self, body: dict[str, Any], client: openai.AsyncOpenAI | None, key: str, turn: int
    ) -> tuple[str, ...]:
        cache_key = body_key(body)
        cached = self._cache.get(cache_key)
        if cached is not None:
            return tuple(cached)
        if client is None:
            raise FailedPrecondition(f"reference of {key} turn {turn + 1}: not cached and no reference fleet")
        got = await send(client, body, lost_timeout_s=REFERENCE_TIMEOUT_S)
        self.asked += 1
        if got.error is not None:
            raise FailedPrecondition(f"reference of {key} turn {turn + 1} failed: {got.error.describe()}")
        if any(f is None for f in got.finishes):
            raise FailedPrecondition(f"reference of {key} turn {turn + 1}: a choice ended without finish_reason")
        self._cache[cache_key] = list(got.texts)
        return tuple(got.texts)

    def answers(self, spec: RequestSpec) -> tuple[tuple[str, ...], ...]:
        """Per turn, per choice, the reference text.

        Raises:
            KeyError: `fill` did not cover `spec`.
        """
        return self._answers[spec.key]

    def save(self) -> None:
        """Write the cache file (atomically: a temporary file renamed over it)."""
        if self._cache_path is None:
            return
        tmp = self._cache_path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"schema": CACHE_SCHEMA, "answers": self._cache}), encoding="utf-8")
        tmp.replace(self._cache_path)
