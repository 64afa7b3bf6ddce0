"""The conversations' message flow without processes: a fake `send` records what each turn carried
(the system prompt, every earlier user message and streamed answer, the new message), the indexes
and `max_tokens`; a fake clock and sleep record the think times and staggered starts; a failed turn
ends its conversation. Also the warm-up and window framing of `run_multiturn`."""

from __future__ import annotations

import asyncio

import pytest

from calculet.ops.bench.device_stats import UtilizationSample
from calculet.ops.bench.multiturn.conversation import run_conversations
from calculet.ops.bench.multiturn.run import MultiturnResult, run_multiturn
from calculet.ops.bench.multiturn.text import SizedText
from calculet.ops.bench.multiturn.turns import TurnRecord, TurnRequest
from calculet.ops.bench.multiturn.workload import Conversation, MultiturnSpec, MultiturnWorkload, ThinkTime
from calculet.ops.bench.records import RequestRecord
from calculet.ops.bench.slo import Slo


def workload(users: int = 2, turns: int = 3, system: str | None = "SYS", warmup: int = 0) -> MultiturnWorkload:
    spec = MultiturnSpec(users, turns, 3 if system else 0, 2, 5, ThinkTime(0.0, 0.0), stagger_s=0.5)
    conversations = tuple(
        Conversation(
            user=u,
            start_s=0.5 * u,
            messages=tuple(SizedText(f"u{u}m{k}", 2) for k in range(1, turns + 1)),
            think_s=tuple(10.0 * u + k for k in range(1, turns)),
        )
        for u in range(users)
    )
    warm = tuple(SizedText(f"warm{i}", 2) for i in range(warmup))
    return MultiturnWorkload(spec, SizedText(system, 3) if system else None, conversations, warm)


class FakeChat:
    """Answers every turn with `a<user>.<turn>` (3 tokens in one chunk each), unless told to fail it."""

    def __init__(self, fail: set[tuple[int, int]] | None = None) -> None:
        self.sent: list[TurnRequest] = []
        self.fail = fail or set()

    async def send(self, request: TurnRequest) -> TurnRecord:
        self.sent.append(request)
        await asyncio.sleep(0)
        record = RequestRecord(request.index, request.max_tokens, 0.0, prompt_tokens=10)
        if (request.user, request.turn) in self.fail:
            record.fail(1.0, "unavailable: board down")
        else:
            record.arrived(0.5, None)
            record.finish(1.0, request.max_tokens)
        return TurnRecord(request.user, request.turn, record, f"a{request.user}.{request.turn}", 0, False)


class FakeTime:
    """A clock that only moves when slept on, and the sleeps asked for."""

    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        await asyncio.sleep(0)


def conversation_of(chat: FakeChat, user: int) -> list[TurnRequest]:
    return [r for r in chat.sent if r.user == user]


def test_each_turn_carries_the_whole_conversation_so_far() -> None:
    chat, time = FakeChat(), FakeTime()
    records = asyncio.run(run_conversations(workload(), chat.send, first_index=4, clock=time.clock, sleep=time.sleep))
    assert [(r.user, r.turn) for r in records] == [(0, 1), (0, 2), (0, 3), (1, 1), (1, 2), (1, 3)]
    for user in (0, 1):
        turns = conversation_of(chat, user)
        assert [t.turn for t in turns] == [1, 2, 3]
        assert [t.index for t in turns] == [4 + 3 * user + k for k in range(3)]
        assert all(t.max_tokens == 5 for t in turns)
        third = [(m.role, m.content) for m in turns[2].messages]
        assert third == [
            ("system", "SYS"),
            ("user", f"u{user}m1"), ("assistant", f"a{user}.1"),
            ("user", f"u{user}m2"), ("assistant", f"a{user}.2"),
            ("user", f"u{user}m3"),
        ]  # fmt: skip
        assert turns[1].messages == turns[2].messages[:4]  # each turn extends the previous one
        assert [(m.role, m.content) for m in turns[0].messages] == [("system", "SYS"), ("user", f"u{user}m1")]


def test_users_start_staggered_and_think_between_turns() -> None:
    chat, time = FakeChat(), FakeTime()
    asyncio.run(run_conversations(workload(users=3), chat.send, clock=time.clock, sleep=time.sleep))
    # user 0 starts at once; users 1 and 2 wait 0.5 and 1.0 s; each thinks 10u + 1 and 10u + 2 s
    assert sorted(time.sleeps) == sorted([0.5, 1.0, 1.0, 2.0, 11.0, 12.0, 21.0, 22.0])


def test_back_to_back_turns_never_sleep_between_turns() -> None:
    # --think-time 0 (issue 32's variant): each turn is sent the moment the previous answer ended.
    chat, time = FakeChat(), FakeTime()
    base = workload(users=2, turns=4)
    spec = MultiturnSpec(2, 4, 3, 2, 5, ThinkTime.parse("0"), stagger_s=0.0)
    back_to_back = tuple(Conversation(c.user, 0.0, c.messages, (0.0,) * 3) for c in base.conversations)
    records = asyncio.run(
        run_conversations(
            MultiturnWorkload(spec, base.system, back_to_back, ()), chat.send, clock=time.clock, sleep=time.sleep
        )
    )
    assert len(records) == 8 and time.sleeps == []
    assert [t.turn for t in conversation_of(chat, 0)] == [1, 2, 3, 4]


def test_a_failed_turn_ends_its_conversation_only() -> None:
    chat = FakeChat(fail={(1, 2)})
    time = FakeTime()
    records = asyncio.run(run_conversations(workload(), chat.send, clock=time.clock, sleep=time.sleep))
    assert [(r.user, r.turn, r.ok) for r in records] == [
        (0, 1, True), (0, 2, True), (0, 3, True), (1, 1, True), (1, 2, False),
    ]  # fmt: skip
    assert [t.turn for t in conversation_of(chat, 1)] == [1, 2]
    assert 12.0 not in time.sleeps  # no think after the failed turn


def test_without_a_system_prompt_the_first_message_is_the_users() -> None:
    chat, time = FakeChat(), FakeTime()
    asyncio.run(run_conversations(workload(users=1, system=None), chat.send, clock=time.clock, sleep=time.sleep))
    assert [m.role for m in chat.sent[1].messages] == ["user", "assistant", "user"]


def test_the_run_warms_up_then_measures_the_conversations_in_its_window() -> None:
    chat = FakeChat(fail={(1, 0)})  # warm-up chat 1 fails: counted, not measured
    sampled: list[str] = []

    async def status_of(target: str) -> UtilizationSample | None:
        sampled.append(target)
        return None

    async def go() -> MultiturnResult:
        async def no_sleep(seconds: float) -> None:
            await asyncio.sleep(0)

        return await run_multiturn(workload(warmup=2), chat.send, Slo(), ["b0"], status_of, sleep=no_sleep)

    result = asyncio.run(go())
    assert [(r.user, r.turn, r.index) for r in chat.sent[:2]] == [(0, 0, 0), (1, 0, 1)]
    assert [(m.role, m.content) for m in chat.sent[0].messages] == [("user", "warm0")]
    assert result.bench.warmup_failed == 1
    assert [r.index for r in result.bench.records] == [2, 3, 4, 5, 6, 7]
    assert result.bench.summary.completed == 6 and result.bench.summary.output_tokens == 30
    assert len(result.turns) == 6 and sampled == ["b0", "b0"]


@pytest.mark.parametrize("users", [1, 4])
def test_every_user_sends_every_turn(users: int) -> None:
    chat, time = FakeChat(), FakeTime()
    records = asyncio.run(run_conversations(workload(users=users), chat.send, clock=time.clock, sleep=time.sleep))
    assert len(records) == len(chat.sent) == 3 * users
    assert sorted(r.index for r in chat.sent) == list(range(3 * users))
