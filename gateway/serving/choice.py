"""`ChoiceRunner`: one choice of one request, kept alive across boards until it really ends.

Data flow: the service gives a `ChoiceSubmit` (prompt tokens, seed, limits), the package's text,
the prompt's `RouteRequest` and the choice's first `BoardClaim` (a board already counted for it).
The runner submits there and turns the daemon's token chunks into `ChoiceDelta`s (text from the
`Detokenizer`, cut by the `StopMatcher`), then one `ChoiceEnd` (with the daemon Final's cached
prompt tokens, for usage).

Retry and failover (docs/daemon.md "Recovery without loss"): every token received is remembered. When
a board refuses the job (UNAVAILABLE, RESOURCE_EXHAUSTED, NOT_FOUND during a rollout) or its
stream breaks (daemon killed, drained with interruption: UNAVAILABLE), the same `ChoiceSubmit` goes to
another board with `resume_tokens` = the tokens received so far and the same seed. Sampling draws
are keyed by (seed, completion index), so the continuation is exactly the undisturbed run's and
the client never sees the switch. Only boards serving the same package (same tokenizer) qualify:
the router places the retry like any pick (`Router.place`, counted before anything awaits), its
request covering the prompt and the tokens to resume. Mid-stream, when no other board is left,
the runner waits up to `failover_wait_s` for one to come (back) up; before the first token it
fails at once, so the client can go elsewhere.

Answer memory (chat only: the service passes its `AnswerMemory`): a choice that ends normally,
finish "stop" by an EOS or stop token or "length", with no stop string cut, remembers the text its
client got -> the ids the daemon produced for it (a trailing stop token left out: the chat template
renders the end of the turn itself), so the conversation's next turn can be spliced to exactly
what the board's lane holds (`text/answer_splice.py`). It is remembered before the `ChoiceEnd` is
yielded, so before the client can send the next turn.

Ownership: the runner owns the daemon streams it opens (closes them; cancels the job when the
reader stops early or a stop string matched) and its current `BoardClaim`: the first one from the
service, then each one it places itself. It releases a placement when the attempt on that board
ends, however it ends; `close` releases one it still holds (a runner that never ran), and `run`
calls it on the way out, so no path leaves a count on a board.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Coroutine, Sequence
from dataclasses import dataclass

from calculet.client.types import FinalEvent, FinishReason, TokenChunk, TokenLogprob
from calculet.common.errors import CalculetError, ErrorKind, Overloaded, Unavailable
from calculet.gateway.fleet.connection import ChoiceSubmit, DaemonStream
from calculet.gateway.fleet.fleet import Fleet
from calculet.gateway.routing.claim import BoardClaim
from calculet.gateway.routing.router import Router
from calculet.gateway.routing.scoring.inputs import RouteRequest
from calculet.gateway.serving.observer import NoObserver, ServingObserver
from calculet.gateway.serving.tracing import PlainScope, RequestScope
from calculet.gateway.text.answer_memory import AnswerMemory
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
# After a stop string cancels the job: how long to wait for its Final (its usage) before ending the
# choice without it. The daemon answers a cancel within a device step; this only bounds a stuck one.
FINAL_AFTER_CANCEL_S = 2.0


@dataclass(frozen=True)
class ChoiceDelta:
    """New output of one choice: text that may be sent, and the tokens behind it."""

    text: str
    tokens: tuple[int, ...]
    logprobs: tuple[TokenLogprob, ...]


@dataclass(frozen=True)
class ChoiceEnd:
    """The choice is over.

    Attributes:
        finish_reason: OpenAI's "stop" or "length".
        completion_tokens: tokens generated (streamed before a failover included).
        cached_tokens: prompt tokens the last board served from KV instead of prefilling (its
            daemon Final's `usage.cached_tokens`; 0 when the Final did not come).
    """

    finish_reason: str
    completion_tokens: int
    cached_tokens: int = 0


ChoiceEvent = ChoiceDelta | ChoiceEnd


@dataclass(frozen=True)
class RetryPolicy:
    """Attempts per choice (submits on any board) and the mid-stream wait for a board to return."""

    max_attempts: int = 6
    failover_wait_s: float = 15.0


class ChoiceRunner:
    """Runs one choice to its end over the fleet.

    Args:
        fleet / router: the boards and how to place a choice on one.
        text: the package's tokenizer (its package hash restricts which boards may continue).
        job: the request, seed included.
        stops: stop strings.
        first: the choice's first placement (owned by the runner from now on).
        policy: retry budget.
        observer: told of each retry and failover (metrics).
        scope: the request's id and trace: each attempt's Submit carries its metadata.
        route: the prompt's routing request (its block hashes, reused on a failover); built from
            `job` when not given.
        answers: where to remember the answer when the choice ends normally (chat); None: nowhere.
    """

    def __init__(
        self,
        fleet: Fleet,
        router: Router,
        text: ModelText,
        job: ChoiceSubmit,
        stops: tuple[str, ...],
        first: BoardClaim,
        policy: RetryPolicy,
        observer: ServingObserver | None = None,
        scope: RequestScope | None = None,
        route: RouteRequest | None = None,
        answers: AnswerMemory | None = None,
    ) -> None:
        self._fleet, self._router, self._text, self._job = fleet, router, text, job
        self._answers = answers
        self._sent: list[str] = []  # the text given to the client, delta by delta
        self._observer = observer or NoObserver()
        self._scope: RequestScope = scope or PlainScope()
        self._placement: BoardClaim | None = first
        self._fresh = True  # `_placement` is the service's, not attempted yet
        self._route = route
        self._policy = policy
        self._tokens: list[int] = []
        self._detok = Detokenizer(text.tokenizer, text.tokenizer_size)
        self._stops = StopMatcher(stops)
        self._stop_ids = frozenset(job.stop_token_ids) | (
            frozenset() if job.ignore_eos else frozenset(text.facts.eos_token_ids)
        )
        self._failed: dict[str, int] = {}  # board target -> its epoch when this choice failed there
        self.failovers = 0

    @property
    def placement(self) -> BoardClaim | None:
        """The placement the runner holds now (None between attempts and after the end)."""
        return self._placement

    def close(self) -> None:
        """Release the placement the runner holds, if any (a runner that never ran, or one cut
        short). Idempotent; `run` calls it on the way out."""
        self._fresh = False
        self._release(completed=False)

    async def run(self) -> AsyncGenerator[ChoiceEvent, None]:
        """The choice's events: deltas, then one ChoiceEnd.

        Raises:
            CalculetError: the choice cannot go on (no board left, retry budget spent, or an
                error no other board would change: InvalidArgument, DeadlineExceeded, Aborted).
        """
        attempts, last_err = 0, None
        wait_until: float | None = None
        try:
            while True:
                placement = await self._next_placement(wait_until)
                if placement is None:
                    if self._tokens and wait_until is None:
                        wait_until = time.monotonic() + self._policy.failover_wait_s
                        continue
                    raise self._give_up(last_err)
                if attempts >= self._policy.max_attempts:
                    raise self._give_up(last_err)
                if attempts:  # another board after a failed attempt: a failover once tokens were streamed
                    self._observer.resubmitted(self._job.model, mid_stream=bool(self._tokens))
                attempts += 1
                board = placement.board
                attempt = self._scope.attempt(board.target, len(self._tokens))
                error: BaseException | None = None
                completed = False
                try:
                    async with contextlib.aclosing(self._attempt(placement, attempt.metadata)) as events:
                        async for event in events:
                            completed = isinstance(event, ChoiceEnd)
                            yield event
                            if completed:
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
                    self._release(completed=completed)
                if self._done_without_final():
                    async for event in self._finish_here():
                        yield event
                    return
        finally:
            self.close()

    def _done_without_final(self) -> bool:
        """The lost stream had already produced its last token (its max_tokens, or a stop token)
        and only its Final was lost: nothing is left to resume (a daemon refuses such a resume)."""
        if not self._tokens:
            return False
        limit = self._job.max_tokens
        return self._tokens[-1] in self._stop_ids or (limit is not None and len(self._tokens) >= limit)

    async def _finish_here(self) -> AsyncGenerator[ChoiceEvent, None]:
        """End the choice as its Final would have: the held-back text, then the reason."""
        if (held := self._held_back()) is not None:
            yield held
        stopped = self._stops.stopped or self._tokens[-1] in self._stop_ids
        yield ChoiceEnd("stop" if stopped else "length", len(self._tokens), 0)

    def _release(self, *, completed: bool) -> None:
        placement, self._placement = self._placement, None
        if placement is not None:
            placement.release(completed=completed)

    async def _attempt(
        self, placement: BoardClaim, metadata: Sequence[tuple[str, str]]
    ) -> AsyncGenerator[ChoiceEvent, None]:
        """Submit on the placement's board (with the attempt's `metadata`) and stream until the
        job's end; the first chunk ends the placement's prefill.

        Raises: CalculetError."""
        board = placement.board
        stream = await board.conn.start(self._job, self._tokens, metadata)
        finished = False
        try:
            chunks = stream.chunks()
            async for chunk in chunks:
                placement.first_token()
                delta = self._take(chunk)
                if delta is not None:
                    self._sent.append(delta.text)
                    yield delta
                if self._stops.stopped:
                    finished = True
                    await stream.cancel()
                    stopped = await _final_after_cancel(chunks, stream, board.target)
                    yield ChoiceEnd("stop", len(self._tokens), _cached(stopped))
                    return
            final = stream.final
            finished = True
            if final is None or final.reason is FinishReason.CANCELLED:
                # Cancelled by someone else than us (orphan timeout, an operator): the job is not
                # over for the client, so continue it elsewhere like any lost stream.
                raise Unavailable(f"job on {board.name} was cancelled by the daemon")
            if (held := self._held_back()) is not None:
                yield held
            reason = "length" if final.reason is FinishReason.LENGTH and not self._stops.stopped else "stop"
            self._remember(final)
            yield ChoiceEnd(reason, len(self._tokens), _cached(final))
        finally:
            if not finished:
                # The reader went away (client disconnected) or the stream failed: make sure the
                # daemon frees the lane now rather than at its orphan timeout. A task of its own,
                # so a cancelled reader (level-triggered under anyio) cannot stop it half-way.
                _background(stream.cancel())
            await stream.aclose()

    def _held_back(self) -> ChoiceDelta | None:
        """At the choice's end: the text the detokenizer and the stop matcher still hold, if any."""
        tail = self._detok.flush()
        text = self._stops.feed(tail).text if tail else ""
        if not self._stops.stopped:
            text += self._stops.flush()
        if not text:
            return None
        self._sent.append(text)
        return ChoiceDelta(text, (), ())

    def _remember(self, final: FinalEvent) -> None:
        """Remember the answer (see the module docstring) if the choice ended normally: the job
        stopped on a token or at its length, and no stop string cut the text."""
        if self._answers is None or self._stops.stopped:
            return
        ids = answer_ids(self._tokens, final.reason, self._stop_ids)
        if ids is not None:
            self._answers.remember(self._text.facts.package_hash, "".join(self._sent), ids)

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

    async def _next_placement(self, wait_until: float | None) -> BoardClaim | None:
        """The placement of the next attempt: the service's first, then a board serving the same
        package and not failed in its current epoch, placed by the router. None when none is left
        (after waiting for fleet changes until `wait_until`)."""
        if self._fresh:
            self._fresh = False
            return self._placement
        alias = self._job.model
        while True:
            # Boards whose package this gateway has not asked yet are learnt first (GetModel,
            # once per board generation); nothing awaits between the exclusions and the placement.
            await self._fleet.packages.identify(alias, self._router.candidates(alias, self._excluded()))
            placement = self._router.place(self._route_request(), self._excluded())
            if placement is not None:
                self._placement = placement
                return placement
            remaining = 0.0 if wait_until is None else wait_until - time.monotonic()
            if remaining <= 0:
                return None
            await self._fleet.wait_changed(remaining)

    def _excluded(self) -> set[str]:
        return {t for t, epoch in self._failed.items() if self._same_epoch(t, epoch)}

    def _route_request(self) -> RouteRequest:
        """What the next board must hold before the next token: the prompt and the tokens to resume."""
        if self._route is None:
            package = self._text.facts.package_hash
            self._route = RouteRequest.build(self._job.model, package, self._job.prompt_tokens, self._job.session_id)
        if not self._tokens:
            return self._route
        return self._route.continued([*self._job.prompt_tokens, *self._tokens])

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


def answer_ids(tokens: Sequence[int], reason: FinishReason, stop_ids: frozenset[int]) -> Sequence[int] | None:
    """The ids behind a finished choice's text, as the next turn's prompt should carry them.

    Args:
        tokens: every token the choice generated.
        reason: the daemon's finish reason.
        stop_ids: the ids that end this choice (EOS unless ignored, the request's stop token ids).
    Returns:
        `tokens` without a trailing stop token when the job stopped on one; all of `tokens` at
        "length"; None for any other end (cancelled, error), which is not remembered.
    """
    if reason is FinishReason.LENGTH:
        return tokens
    if reason is not FinishReason.STOP:
        return None
    return tokens[:-1] if tokens and tokens[-1] in stop_ids else tokens


def _cached(final: FinalEvent | None) -> int:
    """The Final's cached prompt tokens (0 without a Final)."""
    return final.usage.cached_tokens if final is not None else 0


async def _final_after_cancel(
    chunks: AsyncIterator[TokenChunk], stream: DaemonStream, target: str
) -> FinalEvent | None:
    """After the runner cancelled the job (a stop string matched): its Final, for the usage.

    Reads and drops what the daemon still sends (tokens sampled before the cancel took effect,
    then the CANCELLED Final). The choice is complete whatever happens here, so a stream that
    breaks, or a Final that does not come within `FINAL_AFTER_CANCEL_S`, costs only the cached-token
    figure (logged, reported as 0).

    Args:
        chunks: the stream's chunk iterator, part-way through.
        stream: the stream (its `final`).
        target: the board, for the log.
    Returns:
        The Final, or None.
    """
    try:
        async with asyncio.timeout(FINAL_AFTER_CANCEL_S):
            async for _ in chunks:
                pass
    except TimeoutError:
        log.info("board %s: no Final within %.1f s of a cancel; cached tokens unknown", target, FINAL_AFTER_CANCEL_S)
        return None
    except CalculetError as err:
        log.info("board %s: stream broke after a cancel (%s); cached tokens unknown", target, err)
        return None
    return stream.final
