"""`Generation` / `AsyncGeneration` / `WaitCursor` against scripted in-memory streams (no gRPC).

The script is a job's event list plus, per event index, how many times the stream breaks with
UNAVAILABLE before that event is delivered. The property: whatever the chunking and breaks, the
reader gets exactly the job's tokens (token by token, or chunk by chunk with `chunks()`),
re-attaching from the right index, unless some index breaks more often in a row than the budget
allows, in which case it gets the tokens before it and then `Unavailable`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calculet.client import FinishReason, TokenChunk, TokenLogprob
from calculet.client.generation import AsyncGeneration, Generation, StreamState, WaitCursor
from calculet.client.messages import SubmitResult
from calculet.common.errors import (
    Aborted,
    CalculetError,
    DeadlineExceeded,
    ErrorKind,
    InvalidArgument,
    NotFound,
    Overloaded,
    Unavailable,
)
from calculet.v1 import common_pb2, inference_pb2

from .fake_daemon import chunk_event, final_event

SUBMITTED = SubmitResult(job_id="job-1", deduplicated=False, seed=11, generation=3)


def events_for(chunks: list[list[int]], resumed: int = 0, **final_kw: object) -> list[inference_pb2.WaitEvent]:
    events, position = [], resumed
    for i, tokens in enumerate(chunks):
        events.append(chunk_event(i, position, tokens))
        position += len(tokens)
    events.append(final_event(len(events), **final_kw))  # type: ignore[arg-type]
    return events


@dataclass
class ScriptedJob:
    """A job's Wait streams: `breaks[i]` UNAVAILABLE failures before event i is delivered."""

    events: list[inference_pb2.WaitEvent]
    breaks: dict[int, int] = field(default_factory=dict)
    reattach_error: CalculetError | None = None  # what a re-attach gets instead of a stream
    opened_from: list[int] = field(default_factory=list)
    ready_waits: int = 0
    closed: int = 0

    def open(self, from_index: int) -> Iterator[inference_pb2.WaitEvent]:
        self.opened_from.append(from_index)
        return self._stream(from_index, reattach=len(self.opened_from) > 1)

    def _stream(self, from_index: int, reattach: bool) -> Iterator[inference_pb2.WaitEvent]:
        try:
            if reattach and self.reattach_error is not None:
                raise self.reattach_error
            for i in range(from_index, len(self.events)):
                if self.breaks.get(i, 0) > 0:
                    self.breaks[i] -= 1
                    raise Unavailable("Socket closed")
                yield self.events[i]
        finally:
            self.closed += 1

    async def aopen_gen(self, from_index: int) -> AsyncIterator[inference_pb2.WaitEvent]:
        for event in self.open(from_index):
            yield event

    def wait_ready(self) -> None:
        self.ready_waits += 1

    async def await_ready(self) -> None:
        self.ready_waits += 1


def sync_generation(job: ScriptedJob, resumed: int = 0, max_reattach: int = 3) -> Generation:
    cursor = WaitCursor(SUBMITTED, resumed, max_reattach)
    return Generation(cursor, job.open, job.wait_ready, lambda job_id: True)


def async_generation(job: ScriptedJob, resumed: int = 0, max_reattach: int = 3) -> AsyncGeneration:
    async def cancel(job_id: str) -> bool:
        return True

    cursor = WaitCursor(SUBMITTED, resumed, max_reattach)
    return AsyncGeneration(cursor, job.aopen_gen, job.await_ready, cancel)


def read_sync(gen: Generation) -> tuple[list[int], CalculetError | None]:
    got: list[int] = []
    try:
        for token in gen:
            got.append(token)
    except CalculetError as err:
        return got, err
    return got, None


def read_sync_chunks(gen: Generation) -> tuple[list[TokenChunk], CalculetError | None]:
    got: list[TokenChunk] = []
    try:
        for chunk in gen.chunks():
            got.append(chunk)
    except CalculetError as err:
        return got, err
    return got, None


def read_async_chunks(gen: AsyncGeneration) -> tuple[list[TokenChunk], CalculetError | None]:
    async def read() -> tuple[list[TokenChunk], CalculetError | None]:
        got: list[TokenChunk] = []
        try:
            async for chunk in gen.chunks():
                got.append(chunk)
        except CalculetError as err:
            return got, err
        return got, None

    return asyncio.run(read())


def read_async(gen: AsyncGeneration) -> tuple[list[int], CalculetError | None]:
    async def read() -> tuple[list[int], CalculetError | None]:
        got: list[int] = []
        try:
            async for token in gen:
                got.append(token)
        except CalculetError as err:
            return got, err
        return got, None

    return asyncio.run(read())


TOKENS = st.integers(0, 2**32 - 1)
CHUNKS = st.lists(st.lists(TOKENS, min_size=1, max_size=4), min_size=0, max_size=6)


@st.composite
def scripts(draw: st.DrawFn) -> tuple[list[list[int]], int, dict[int, int], int]:
    chunks = draw(CHUNKS)
    resumed = draw(st.integers(0, 5))
    indexes = st.integers(0, len(chunks))  # the Final's index can break too
    breaks = draw(st.dictionaries(indexes, st.integers(1, 4), max_size=3))
    budget = draw(st.integers(0, 3))
    return chunks, resumed, breaks, budget


def expected_outcome(chunks: list[list[int]], breaks: dict[int, int], budget: int) -> tuple[list[int], bool, list[int]]:
    """Tokens delivered before the first index that breaks more often than the budget, whether one
    does, and the event index of every re-attach in order."""
    tokens: list[int] = []
    reattaches: list[int] = []
    for i in range(len(chunks) + 1):
        reattaches += [i] * min(breaks.get(i, 0), budget)
        if breaks.get(i, 0) > budget:
            return tokens, True, reattaches
        if i < len(chunks):
            tokens.extend(chunks[i])
    return tokens, False, reattaches


@settings(max_examples=150, deadline=None)
@given(scripts())
def test_sync_generation_delivers_every_token_once_across_breaks(script: tuple) -> None:
    chunks, resumed, breaks, budget = script
    job = ScriptedJob(events_for(chunks, resumed), dict(breaks))
    gen = sync_generation(job, resumed, budget)
    got, err = read_sync(gen)
    want, lost, reattaches = expected_outcome(chunks, breaks, budget)
    assert got == want == gen.tokens
    if lost:
        assert isinstance(err, Unavailable) and gen.state is StreamState.LOST and gen.final is None
    else:
        assert err is None and gen.state is StreamState.DONE
        assert gen.final is not None and gen.final.reason is FinishReason.LENGTH
    # every re-attach waited for the channel and resumed exactly where the stream broke
    assert job.opened_from == [0, *reattaches]
    assert job.ready_waits == len(reattaches)
    assert job.closed == len(job.opened_from)  # no stream left open


@settings(max_examples=40, deadline=None)
@given(scripts())
def test_async_generation_has_the_same_semantics(script: tuple) -> None:
    chunks, resumed, breaks, budget = script
    job = ScriptedJob(events_for(chunks, resumed), dict(breaks))
    gen = async_generation(job, resumed, budget)
    got, err = read_async(gen)
    want, lost, reattaches = expected_outcome(chunks, breaks, budget)
    assert got == want == gen.tokens
    assert isinstance(err, Unavailable) if lost else err is None
    assert job.opened_from == [0, *reattaches]


def assert_contiguous(chunks: list[TokenChunk], resumed: int) -> None:
    """Event indexes 0, 1, 2 ... and token positions from `resumed` without gaps."""
    assert [c.index for c in chunks] == list(range(len(chunks)))
    position = resumed
    for chunk in chunks:
        assert chunk.first_index == position and chunk.tokens
        position += len(chunk.tokens)


@settings(max_examples=100, deadline=None)
@given(scripts())
def test_sync_chunks_deliver_every_chunk_once_across_breaks(script: tuple) -> None:
    chunks, resumed, breaks, budget = script
    job = ScriptedJob(events_for(chunks, resumed), dict(breaks))
    gen = sync_generation(job, resumed, budget)
    got, err = read_sync_chunks(gen)
    want, lost, reattaches = expected_outcome(chunks, breaks, budget)
    assert [t for c in got for t in c.tokens] == want == gen.tokens
    assert [list(c.tokens) for c in got] == chunks[: len(got)], "tokens that arrived together stay together"
    assert_contiguous(got, resumed)
    if lost:
        assert isinstance(err, Unavailable) and gen.state is StreamState.LOST and gen.final is None
    else:
        assert err is None and gen.state is StreamState.DONE
        assert gen.final is not None and gen.final.reason is FinishReason.LENGTH
    assert job.opened_from == [0, *reattaches]
    assert job.ready_waits == len(reattaches)
    assert job.closed == len(job.opened_from)


@settings(max_examples=40, deadline=None)
@given(scripts())
def test_async_chunks_have_the_same_semantics(script: tuple) -> None:
    chunks, resumed, breaks, budget = script
    job = ScriptedJob(events_for(chunks, resumed), dict(breaks))
    gen = async_generation(job, resumed, budget)
    got, err = read_async_chunks(gen)
    want, lost, reattaches = expected_outcome(chunks, breaks, budget)
    assert [t for c in got for t in c.tokens] == want == gen.tokens
    assert [list(c.tokens) for c in got] == chunks[: len(got)]
    assert_contiguous(got, resumed)
    assert isinstance(err, Unavailable) if lost else err is None
    assert gen.final is None if lost else gen.final is not None
    assert job.opened_from == [0, *reattaches]
    assert job.ready_waits == len(reattaches)


def logprob_events() -> list[inference_pb2.WaitEvent]:
    def lp(token: int, value: float) -> inference_pb2.TokenLogprob:
        top = [inference_pb2.TopLogprob(token=token, logprob=value), inference_pb2.TopLogprob(token=7, logprob=-3.0)]
        return inference_pb2.TokenLogprob(token=token, logprob=value, top=top)

    first = inference_pb2.TokenChunk(first_index=0, tokens=[4, 5, 6], logprobs=[lp(4, -0.5), lp(5, -1.0), lp(6, -2.0)])
    second = inference_pb2.TokenChunk(first_index=3, tokens=[8], logprobs=[lp(8, -0.25)])
    events = [inference_pb2.WaitEvent(index=0, tokens=first), inference_pb2.WaitEvent(index=1, tokens=second)]
    return [*events, final_event(2, completion=4)]


def test_chunks_carry_their_logprobs() -> None:
    got, err = read_sync_chunks(sync_generation(ScriptedJob(logprob_events())))
    assert err is None
    assert got == [
        TokenChunk(
            0,
            0,
            (4, 5, 6),
            (
                TokenLogprob(4, -0.5, ((4, -0.5), (7, -3.0))),
                TokenLogprob(5, -1.0, ((5, -1.0), (7, -3.0))),
                TokenLogprob(6, -2.0, ((6, -2.0), (7, -3.0))),
            ),
        ),
        TokenChunk(1, 3, (8,), (TokenLogprob(8, -0.25, ((8, -0.25), (7, -3.0))),)),
    ]


def test_token_and_chunk_reads_can_be_mixed() -> None:
    def check(first: int, rest: list[TokenChunk], gen: Generation | AsyncGeneration) -> None:
        assert first == 4
        # the rest of the partly read chunk keeps its event index; positions and logprobs advance
        assert [(c.index, c.first_index, c.tokens) for c in rest] == [(0, 1, (5, 6)), (1, 3, (8,))]
        assert [lp.token for lp in rest[0].logprobs] == [5, 6]
        assert gen.final is not None and gen.tokens == [4, 5, 6, 8]

    gen = sync_generation(ScriptedJob(logprob_events()))
    first = next(gen)
    check(first, list(gen.chunks()), gen)

    async def run() -> None:
        agen = async_generation(ScriptedJob(logprob_events()))
        first = await anext(agen)
        check(first, [c async for c in agen.chunks()], agen)

    asyncio.run(run())


def test_chunks_raise_the_final_error_after_the_chunks() -> None:
    events = error_final(common_pb2.ERROR_KIND_UNAVAILABLE, "model draining")
    for read, make in ((read_sync_chunks, sync_generation), (read_async_chunks, async_generation)):
        gen = make(ScriptedJob(list(events)))  # type: ignore[operator]
        got, err = read(gen)  # type: ignore[operator]
        assert [c.tokens for c in got] == [(4, 5), (6,)]
        assert type(err) is Unavailable and err.message == "model draining"
        assert gen.final is not None and gen.final.error is err and gen.final.reason is FinishReason.ERROR


def test_max_reattach_zero_raises_unavailable_at_once_without_waiting_for_the_channel() -> None:
    for read, make in ((read_sync, sync_generation), (read_async, async_generation)):
        job = ScriptedJob(events_for([[1, 2], [3]]), breaks={1: 1})
        gen = make(job, 0, 0)  # type: ignore[operator]
        got, err = read(gen)  # type: ignore[operator]
        assert got == [1, 2]
        assert isinstance(err, Unavailable) and err.message == "Socket closed"
        assert job.ready_waits == 0, "no wait for the channel: the caller fails over at once"
        assert job.opened_from == [0] and gen.state is StreamState.LOST


def error_final(kind: int, message: str, retry: float | None = None) -> list[inference_pb2.WaitEvent]:
    status = common_pb2.ErrorStatus(kind=kind, message=message)  # type: ignore[arg-type]
    if retry is not None:
        status.retry_after_s = retry
    return events_for([[4, 5], [6]], reason=inference_pb2.FINISH_REASON_ERROR, error=status)


@pytest.mark.parametrize(
    ("kind", "cls"),
    [
        (common_pb2.ERROR_KIND_ABORTED, Aborted),
        (common_pb2.ERROR_KIND_UNAVAILABLE, Unavailable),
        (common_pb2.ERROR_KIND_DEADLINE_EXCEEDED, DeadlineExceeded),
    ],
)
def test_a_final_error_is_raised_after_the_tokens_before_it(kind: int, cls: type[CalculetError]) -> None:
    for read, make in ((read_sync, sync_generation), (read_async, async_generation)):
        gen = make(ScriptedJob(error_final(kind, "recovery budget exhausted")))  # type: ignore[operator]
        got, err = read(gen)  # type: ignore[operator]
        assert got == [4, 5, 6]
        assert type(err) is cls and err.message == "recovery budget exhausted"
        assert gen.final is not None and gen.state is StreamState.DONE


def test_an_overloaded_final_keeps_its_retry_hint_and_the_error_is_sticky() -> None:
    gen = sync_generation(ScriptedJob(error_final(common_pb2.ERROR_KIND_OVERLOADED, "admission timeout", 2.5)))
    assert gen.tokens == []
    with pytest.raises(Overloaded) as info:
        gen.result()
    assert info.value.retry_after_s == 2.5
    with pytest.raises(Overloaded):
        next(gen)


def test_a_cancelled_job_ends_the_iteration_normally() -> None:
    job = ScriptedJob(events_for([[1]], reason=inference_pb2.FINISH_REASON_CANCELLED))
    gen = sync_generation(job)
    assert gen.result() == [1]
    assert gen.final is not None and gen.final.reason is FinishReason.CANCELLED


def test_final_facts_are_exposed() -> None:
    job = ScriptedJob(events_for([[1, 2]], generation=5, recoveries=2, completion=2))
    gen = sync_generation(job)
    assert (gen.job_id, gen.seed, gen.generation, gen.recoveries, gen.deduplicated) == ("job-1", 11, 3, 0, False)
    gen.result()
    assert (gen.generation, gen.recoveries) == (5, 2)
    assert gen.final is not None and gen.final.usage.completion_tokens == 2


def test_tokens_arrive_lazily_chunk_by_chunk() -> None:
    job = ScriptedJob(events_for([[1, 2], [3]]))
    gen = sync_generation(job)
    assert next(gen) == 1
    assert gen.tokens == [1, 2] and gen.final is None and not gen.done
    assert [next(gen), next(gen)] == [2, 3]
    assert gen.final is None  # the Final is read only when more is asked for
    assert list(gen) == [] and gen.final is not None


def test_non_unavailable_stream_errors_are_not_retried() -> None:
    job = ScriptedJob(events_for([[1]]))
    job.breaks = {}

    def failing(from_index: int) -> Iterator[inference_pb2.WaitEvent]:
        job.opened_from.append(from_index)
        raise InvalidArgument("from_event_index: beyond the events produced")
        yield  # pragma: no cover - makes this a generator

    gen = Generation(WaitCursor(SUBMITTED, 0, 3), failing, job.wait_ready, lambda j: True)
    with pytest.raises(InvalidArgument):
        next(gen)
    assert job.opened_from == [0] and gen.state is StreamState.LOST


def test_a_job_gone_after_a_break_is_unavailable_not_unknown() -> None:
    job = ScriptedJob(events_for([[1], [2]]), breaks={1: 1}, reattach_error=NotFound("job 'job-1' is unknown"))
    gen = sync_generation(job)
    got, err = read_sync(gen)
    assert got == [1]
    assert isinstance(err, Unavailable) and "resubmit with resume_tokens" in err.message
    assert isinstance(err.__cause__, NotFound)


def test_not_found_on_the_first_attach_stays_not_found() -> None:
    job = ScriptedJob(events_for([[1]]))

    def unknown(from_index: int) -> Iterator[inference_pb2.WaitEvent]:
        raise NotFound("job 'job-1' is unknown or expired")
        yield  # pragma: no cover

    gen = Generation(WaitCursor(SUBMITTED, 0, 3), unknown, job.wait_ready, lambda j: True)
    with pytest.raises(NotFound):
        gen.result()


def test_channel_not_ready_in_time_loses_the_stream() -> None:
    job = ScriptedJob(events_for([[1], [2]]), breaks={1: 1})

    def never_ready() -> None:
        raise Unavailable("daemon did not accept connections again within 1 s")

    gen = Generation(WaitCursor(SUBMITTED, 0, 3), job.open, never_ready, lambda j: True)
    got, err = read_sync(gen)
    assert got == [1] and isinstance(err, Unavailable) and gen.state is StreamState.LOST
    assert job.opened_from == [0]


@pytest.mark.parametrize(
    ("events", "match"),
    [
        ([chunk_event(1, 0, [1]), final_event(2)], "event index 1, expected 0"),
        ([chunk_event(0, 0, [1]), chunk_event(1, 5, [2]), final_event(2)], "position 5, expected 1"),
        ([chunk_event(0, 0, [1])], "ended without a final event"),
        ([chunk_event(0, 0, []), final_event(1)], "event 0 without tokens"),
        (
            [
                inference_pb2.WaitEvent(
                    index=0,
                    tokens=inference_pb2.TokenChunk(
                        first_index=0, tokens=[1, 2], logprobs=[inference_pb2.TokenLogprob(token=1)]
                    ),
                ),
                final_event(1),
            ],
            "1 logprobs for 2 tokens",
        ),
    ],
)
def test_protocol_violations_are_internal_errors(events: list[inference_pb2.WaitEvent], match: str) -> None:
    gen = sync_generation(ScriptedJob(events))
    with pytest.raises(CalculetError, match=match) as info:
        gen.result()
    assert info.value.kind is ErrorKind.INTERNAL and gen.state is StreamState.LOST


def test_resumed_jobs_must_start_after_the_resume_tokens() -> None:
    assert sync_generation(ScriptedJob(events_for([[9]], resumed=3)), resumed=3).result() == [9]
    with pytest.raises(CalculetError, match="position 3, expected 0"):
        sync_generation(ScriptedJob(events_for([[9]], resumed=3)), resumed=0).result()


def test_close_stops_the_stream_but_not_the_job() -> None:
    job = ScriptedJob(events_for([[1, 2], [3]]))
    cancelled: list[str] = []

    def cancel(job_id: str) -> bool:
        cancelled.append(job_id)
        return True

    with Generation(WaitCursor(SUBMITTED, 0, 3), job.open, job.wait_ready, cancel) as gen:
        assert next(gen) == 1
    assert gen.state is StreamState.CLOSED and job.closed == 1 and cancelled == []
    assert list(gen) == [2]  # what had arrived is still handed out, then the iteration ends
    assert gen.cancel() is True and cancelled == ["job-1"]


def test_async_close_and_cancel() -> None:
    job = ScriptedJob(events_for([[1, 2], [3]]))

    async def run() -> None:
        async with async_generation(job) as gen:
            assert await anext(gen) == 1
            assert await gen.cancel() is True
        assert gen.state is StreamState.CLOSED
        assert job.closed == 1

    asyncio.run(run())
