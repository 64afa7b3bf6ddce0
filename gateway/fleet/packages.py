"""`PackageCatalog`: which package each board serves a model from, and each package's text and
costs, learned through GetModel.

Boards may serve one alias from different packages (a rollout), and a prompt's tokens are only
valid for the package whose tokenizer made them, so the router must know every candidate's
package before it places a choice. A board's load report names its package (`ModelLoad.package_hash`):
a package already built from another board is known at once, with no call. Data flow:
`identify(alias, boards)` asks GetModel of each board whose package is not known for the alias's
current generation (once per board generation,
concurrently, single-flight: concurrent requests share one call), and builds a package's
`ModelText` once per package hash (single-flight too; the tokenizer build runs in a thread);
`known(board, alias)` then answers from memory, synchronously, for the router's filters.

Costs: GetModel also carries the package's declared prefill and decode cost (`ModelCosts`); a
package that declares none gets `FALLBACK_PREFILL_MS_PER_TOKEN`, so the prefix and work-ahead
terms still compare boards by tokens.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from calculet.client.types import ModelInfo
from calculet.common.errors import CalculetError, Unavailable
from calculet.gateway.fleet.board import Board
from calculet.gateway.text.model_text import ModelFacts, ModelText

log = logging.getLogger("calculet.gateway.packages")

FALLBACK_PREFILL_MS_PER_TOKEN = 1.0
"""Prefill cost per token for a package that declares none (GetModel's 0): 1 ms, so that token
counts still order the boards (its scale only matters against the lane-wait term)."""


@dataclass(frozen=True)
class ModelCosts:
    """A package's device costs as the router uses them.

    Attributes:
        prefill_fixed_ms: fixed part of one prefill (0 when undeclared).
        prefill_ms_per_token: per prompt token (the fallback when undeclared).
        decode_step_ms: one decode step (0 = undeclared; the same on every candidate, so unused
            by the scorers).
        prefill_chunk_tokens: longest prefill job (0 = unknown).
        declared: the package declared its prefill cost (else the fallback is in use).
    """

    prefill_fixed_ms: float
    prefill_ms_per_token: float
    decode_step_ms: float
    prefill_chunk_tokens: int
    declared: bool

    @classmethod
    def of(cls, info: ModelInfo) -> ModelCosts:
        """The costs GetModel declares, with the fallback for an undeclared per-token cost.

        Args:
            info: the GetModel answer.
        Returns:
            The costs.
        """
        declared = info.prefill_ms_per_token > 0
        return cls(
            prefill_fixed_ms=max(0.0, info.prefill_fixed_ms),
            prefill_ms_per_token=info.prefill_ms_per_token if declared else FALLBACK_PREFILL_MS_PER_TOKEN,
            decode_step_ms=max(0.0, info.decode_step_ms),
            prefill_chunk_tokens=max(0, info.prefill_chunk_tokens),
            declared=declared,
        )


@dataclass(frozen=True)
class ModelPackage:
    """One package of a model: its hash, text (tokenizer, template) and costs."""

    package_hash: str
    text: ModelText
    costs: ModelCosts


_BoardKey = tuple[str, str, int]  # (target, alias, generation)


class PackageCatalog:
    """Packages by hash and boards' packages by (target, alias, generation) (module docstring)."""

    def __init__(self) -> None:
        self._packages: dict[str, ModelPackage] = {}
        self._boards: dict[_BoardKey, str] = {}  # -> package hash
        self._asking: dict[_BoardKey, asyncio.Task[ModelPackage]] = {}
        self._asking_hash: dict[str, asyncio.Task[ModelPackage]] = {}  # by the package a report names
        self._building: dict[str, asyncio.Task[ModelPackage]] = {}

    def known(self, board: Board, alias: str) -> ModelPackage | None:
        """The package `board` serves `alias` from, if known for its reported generation."""
        m = board.model(alias)
        if m is None:
            return None
        digest = self._boards.get((board.target, alias, m.generation)) or m.package_hash
        return self._packages.get(digest) if digest else None

    async def of(self, board: Board, alias: str) -> ModelPackage:
        """The package `board` serves `alias` from (GetModel once per board generation).

        Raises:
            CalculetError: GetModel failed (NotFound, Unavailable) or the package's text is broken.
        """
        found = self.known(board, alias)
        if found is not None:
            return found
        m = board.model(alias)
        key = (board.target, alias, m.generation if m is not None else 0)
        if m is not None and m.package_hash:  # boards naming one package share one GetModel
            shared = self._asking_hash.get(m.package_hash)
            if shared is None:
                shared = asyncio.ensure_future(self._ask(board, alias))
                self._asking_hash[m.package_hash] = shared
                shared.add_done_callback(lambda _: self._asking_hash.pop(m.package_hash, None))
            package = await asyncio.shield(shared)
            if package.package_hash == m.package_hash:
                self._boards[key] = package.package_hash
                return package
        task = self._asking.get(key)
        if task is None:
            task = asyncio.ensure_future(self._ask(board, alias))
            self._asking[key] = task
            task.add_done_callback(lambda _: self._asking.pop(key, None))
        return await asyncio.shield(task)  # a cancelled caller must not cancel the others' call

    async def identify(self, alias: str, boards: Sequence[Board]) -> list[CalculetError]:
        """Learn the package of every board in `boards` not known yet (concurrently).

        Args:
            alias: the model.
            boards: the boards.
        Returns:
            The errors of the boards whose package could not be learnt (they stay unknown, so the
            router leaves them out); empty when all are known.
        """
        unknown = [b for b in boards if self.known(b, alias) is None]
        results = await asyncio.gather(*(self.of(b, alias) for b in unknown), return_exceptions=True)
        errors: list[CalculetError] = []
        for board, result in zip(unknown, results, strict=True):
            if isinstance(result, CalculetError):
                log.warning("board %s: cannot tell which package serves %r (%s)", board.target, alias, result)
                errors.append(result)
            elif isinstance(result, BaseException):
                raise result
        return errors

    async def _ask(self, board: Board, alias: str) -> ModelPackage:
        info = await board.conn.get_model(alias)
        if not info.tokenizer_json:
            raise Unavailable(f"model {alias!r} on {board.name} has no tokenizer yet")
        package = self._packages.get(info.package_hash)
        if package is None:
            task = self._building.get(info.package_hash)
            if task is None:
                task = asyncio.ensure_future(self._build(info))
                self._building[info.package_hash] = task
                task.add_done_callback(lambda _: self._building.pop(info.package_hash, None))
            package = await asyncio.shield(task)
        self._boards[(board.target, alias, info.generation)] = info.package_hash
        return package

    async def _build(self, info: ModelInfo) -> ModelPackage:
        facts = ModelFacts(
            alias=info.alias,
            package_hash=info.package_hash,
            vocab_size=info.vocab_size,
            context=info.context,
            eos_token_ids=tuple(info.eos_token_ids),
            bos_token_id=info.bos_token_id,
        )
        # Building a 150k-token tokenizer takes a moment: keep it off the event loop.
        text = await asyncio.to_thread(ModelText, facts, info.tokenizer_json, info.chat_template)
        package = ModelPackage(info.package_hash, text, ModelCosts.of(info))
        self._packages[info.package_hash] = package
        return package
