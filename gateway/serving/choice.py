"""`ChoiceRunner`: one choice of one request, kept alive across boards until it really ends.

Data flow: the service gives a `ChoiceSubmit` (prompt tokens, seed, limits), the model's text and the
first board. The runner submits there and turns the daemon's token chunks into `ChoiceDelta`s
(text from the `Detokenizer`, cut by the `StopMatcher`), then one `ChoiceEnd`.

Retry and failover (DESIGN.md "Recovery without loss"): every token received is remembered. When
a board refuses the job (UNAVAILABLE, RESOURCE_EXHAUSTED, NOT_FOUND during a rollout) or its
stream breaks (daemon killed, drained with interruption: UNAVAILABLE), the same `ChoiceSubmit` goes to
another board with `resume_tokens` = the tokens received so far and the same seed. Sampling draws
are keyed by (seed, completion index), so the continuation is exactly the undisturbed run's and
the client never sees the switch. Only boards serving the same package (same tokenizer) qualify.
Mid-stream, when no other board is left, the runner waits up to `failover_wait_s` for one to come
(back) up; before the first token it fails at once, so the client can go elsewhere.

Ownership: the runner owns the daemon streams it opens (closes them; cancels the job when the
reader stops early or a stop string matched) and the board it borrowed (`acquire`/`released`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, Coroutine, Sequence
from dataclasses import dataclass

from calculet.client.types import FinishReason, TokenChunk, TokenLogprob
from calculet.daemon.errors import CalculetError, ErrorKind, Overloaded, Unavailable
from calculet.gateway.fleet.board import Board
from calculet.gateway.fleet.connection import ChoiceSubmit
from calculet.gateway.fleet.fleet import Fleet
from calculet.gateway.fleet.router import Router
from calculet.gateway.serving.observer import NoObserver, ServingObserver
from calculet.gateway.serving.tracing import PlainScope, RequestScope
from calculet.gateway.text.detokenizer import Detokenizer
from calculet.gateway.text.model_text import ModelText
from calculet.gateway.text.stops import StopMatcher

log = logging.getLogger("calculet.gateway.choice")

_tasks: set[asyncio.Task[None]] = set()  # strong references to fire-and-forget cancels


def _background(coro: Coroutine[None, None, None]) -> None:
    task = asyncio.get_running_loop().create_task(coro)
    _tasks.add(task)
    task.add_done_callback(_tasks.discard)


# Kinds after which the same request may succeed on another board.
RETRYABLE = frozenset({ErrorKind.UNAVAILABLE, ErrorKind.OVERLOADED, ErrorKind.NOT_FOUND})


@dataclass(frozen=True)
class ChoiceDelta:
    """New output of one choice: text that may be sent, and the tokens behind it."""

    text: str
    tokens: tuple[int, ...]
    logprobs: tuple[TokenLogprob, ...]


@dataclass(frozen=True)
class ChoiceEnd:
    """The choice is over: OpenAI finish_reason ("stop" or "length") and tokens generated."""

    finish_reason: str
    completion_tokens: int


ChoiceEvent = ChoiceDelta | ChoiceEnd


@dataclass(frozen=True)
class RetryPolicy:
    """Attempts per choice (submits on any board) and the mid-stream wait for a board to return."""

    max_attempts: int = 6
    failover_wait_s: float = 15.0


class ChoiceRunner:
    """Runs one choice to its end over the fleet.

    Args:
        fleet / router: the boards and how to pick one.
        text: the model's tokenizer (its package hash restricts which boards may continue).
        job: the request, seed included.
        stops: stop strings.
        first: the board the service already picked (its text was used to tokenize).
        policy: retry budget.
        observer: told of each retry and failover (metrics).
        scope: the request's id and trace: each attempt's Submit carries its metadata.
    """

    def __init__(
        self,
        fleet: Fleet,
        router: Router,
        text: ModelText,
        job: ChoiceSubmit,
        stops: tuple[str, ...],
        first: Board,
        policy: RetryPolicy,
        observer: ServingObserver | None = None,
        scope: RequestScope | None = None,
    ) -> None:
        self._fleet, self._router, self._text, self._job = fleet, router, text, job
        self._observer = observer or NoObserver()
        self._scope: RequestScope = scope or PlainScope()
        self._first: Board | None = first
        self._policy = policy
        self._tokens: list[int] = []
        self._detok = Detokenizer(text.tokenizer, text.tokenizer_size)
        self._stops = StopMatcher(stops)
        self._stop_ids = frozenset(job.stop_token_ids) | (
            frozenset() if job.ignore_eos else frozenset(text.facts.eos_token_ids)
        )
        self._failed: dict[str, int] = {}  # board target -> its epoch when this choice failed there
        self.failovers = 0

    async def run(self) -> AsyncGenerator[ChoiceEvent, None]:
        """The choice's events: deltas, then one ChoiceEnd.

        Raises:
            CalculetError: the choice cannot go on (no board left, retry budget spent, or an
                error no other board would change: InvalidArgument, DeadlineExceeded, Aborted).
        """
        attempts, last_err = 0, None
        wait_until: float | None = None
        while True:
            board = await self._next_board(wait_until)
            if board is None:
                if self._tokens and wait_until is None:
                    wait_until = time.monotonic() + self._policy.failover_wait_s
                    continue
                raise self._give_up(last_err)
            if attempts >= self._policy.max_attempts:
                raise self._give_up(last_err)
            if attempts:  # another board after a failed attempt: a failover once tokens were streamed
                self._observer.resubmitted(self._job.model, mid_stream=bool(self._tokens))
            attempts += 1
            attempt = self._scope.attempt(board.target, len(self._tokens))
            error: BaseException | None = None
            board.acquire()
            try:
                async with contextlib.aclosing(self._attempt(board, attempt.metadata)) as events:
                    async for event in events:
                        yield event
                        if isinstance(event, ChoiceEnd):
                            return
            except CalculetError as err:
                error = err
                if err.kind not in RETRYABLE:
                    raise
                last_err = err
                self._failed[board.target] = board.epoch
                if self._tokens:
                    self.failovers += 1
                log.info(
                    "request %s: choice on %s failed after %d tokens (%s); trying another board",
                    self._scope.request_id or "-", board.target, len(self._tokens), err,
                    extra={"request_id": self._scope.request_id, "board": board.target},
                )  # fmt: skip
            except BaseException as exc:  # cancelled (client gone) or a bug: the attempt ends with it
                error = exc
                raise
            finally:
                attempt.end(error)
                await self._fleet.released(board)

    async def _attempt(self, board: Board, metadata: Sequence[tuple[str, str]]) -> AsyncGenerator[ChoiceEvent, None]:
        """Submit on `board` (with the attempt's `metadata`) and stream until the job's end.

        Raises: CalculetError."""
        stream = await board.conn.start(self._job, self._tokens, metadata)
        finished = False
        try:
            async for chunk in stream.chunks():
                delta = self._take(chunk)
                if delta is not None:
                    yield delta
                if self._stops.stopped:
                    finished = True
                    await stream.cancel()
                    yield ChoiceEnd("stop", len(self._tokens))
                    return
            final = stream.final
            finished = True
            if final is None or final.reason is FinishReason.CANCELLED:
                # Cancelled by someone else than us (orphan timeout, an operator): the job is not
                # over for the client, so continue it elsewhere like any lost stream.
                raise Unavailable(f"job on {board.name} was cancelled by the daemon")
            tail = self._detok.flush()
            text = self._stops.feed(tail).text if tail else ""
            if not self._stops.stopped:
                text += self._stops.flush()
            if text:
                yield ChoiceDelta(text, (), ())
            reason = "length" if final.reason is FinishReason.LENGTH and not self._stops.stopped else "stop"
            yield ChoiceEnd(reason, len(self._tokens))
        finally:
            if not finished:
                # The reader went away (client disconnected) or the stream failed: make sure the
                # daemon frees the lane now rather than at its orphan timeout. A task of its own,
                # so a cancelled reader (level-triggered under anyio) cannot stop it half-way.
                _background(stream.cancel())
            await stream.aclose()

    def _take(self, chunk: TokenChunk) -> ChoiceDelta | None:
        expected = len(self._tokens)  # completion index: resume tokens count, so it never restarts
        if chunk.first_index != expected:
            raise CalculetError(
                f"daemon sent tokens from position {chunk.first_index}, expected {expected}", kind=ErrorKind.INTERNAL
            )
        self._tokens.extend(chunk.tokens)
        visible = [t for t in chunk.tokens if t not in self._stop_ids]
        text = self._stops.feed(self._detok.add(visible)).text
        if not text and not chunk.logprobs:
            return None
        return ChoiceDelta(text, chunk.tokens, chunk.logprobs)

    async def _next_board(self, wait_until: float | None) -> Board | None:
        """The next board to try: one serving the same package and not failed in its current epoch.
        None when the router has none left (after waiting for fleet changes until `wait_until`)."""
        if self._first is not None:
            first, self._first = self._first, None
            return first
        while True:
            exclude = {t for t, epoch in self._failed.items() if self._same_epoch(t, epoch)}
            board = self._router.pick(self._job.model, exclude=exclude, session=self._job.session_id)
            if board is None:
                remaining = 0.0 if wait_until is None else wait_until - time.monotonic()
                if remaining <= 0:
                    return None
                await self._fleet.wait_changed(remaining)
                continue
            try:
                text = await self._fleet.model_text(board, self._job.model)  # cached after the first
            except CalculetError:
                text = None
            if text is not None and text.facts.package_hash == self._text.facts.package_hash:
                return board
            self._failed[board.target] = board.epoch  # another package (or none): never this choice's text

    def _same_epoch(self, target: str, epoch: int) -> bool:
        board = self._fleet.boards.get(target)
        return board is None or board.epoch == epoch

    def _give_up(self, last_err: CalculetError | None) -> CalculetError:
        if last_err is not None and last_err.kind is ErrorKind.OVERLOADED and not self._tokens:
            return last_err if isinstance(last_err, Overloaded) else Overloaded(str(last_err))
        where = f" after {len(self._tokens)} tokens" if self._tokens else ""
        err = Unavailable(
            f"no board could serve model {self._job.model!r}{where}" + (f": {last_err}" if last_err else "")
        )
        err.__cause__ = last_err
        return err
