"""The multi-turn workload builder without processes: texts sized with the presets' real tokenizers
(tiny's byte-level BPE, trained here; Qwen3's), the turn structure, seeded reproducibility, distinct
users, think times and stagger, and the parameters' refusals."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from calculet.common.errors import InvalidArgument
from calculet.ops.bench.multiturn.text import WORDS, sized_text
from calculet.ops.bench.multiturn.workload import MultiturnSpec, ThinkTime, build_workload, user_lead
from calculet.ops.sim_packages.tokenizer import TrainedTokenizer, train_tokenizer

Counter = Callable[[str], int]


def counter_of(trained: TrainedTokenizer) -> Counter:
    return lambda text: len(trained.tokenizer.encode(text, add_special_tokens=False).ids)


@pytest.fixture(scope="module")
def tiny() -> Counter:
    return counter_of(train_tokenizer())


@pytest.fixture(scope="module")
def qwen() -> Counter:
    qwen3 = pytest.importorskip("calculet.ops.sim_packages.qwen3_tokenizer")
    return counter_of(qwen3.build_qwen3_tokenizer())


@pytest.fixture(params=["tiny", "qwen"])
def count(request: pytest.FixtureRequest) -> Counter:
    counter: Counter = request.getfixturevalue(request.param)
    return counter


def spec(**kw: object) -> MultiturnSpec:
    base: dict[str, object] = dict(
        users=4, turns=3, system_tokens=120, user_tokens=20, answer_tokens=8, think=ThinkTime(0.5, 1.5), seed=7
    )
    return MultiturnSpec(**(base | kw))  # type: ignore[arg-type]


@pytest.mark.parametrize("target", [1, 2, 7, 20, 100, 1000])
def test_a_text_has_exactly_the_target_tokens(count: Counter, target: int) -> None:
    for seed in range(5):
        sized = sized_text(target, count, random.Random(seed))
        assert sized.tokens == count(sized.text) == target, (seed, sized.text)
        assert all(word in WORDS for word in sized.text.split(" "))


def test_a_lead_is_kept_even_when_it_alone_is_longer_than_the_target(tiny: Counter) -> None:
    lead = ["important", "understand", "remember"]
    sized = sized_text(2, tiny, random.Random(1), lead=lead)
    assert sized.text == "important understand remember" and sized.tokens == tiny(sized.text) > 2
    longer = sized_text(40, tiny, random.Random(1), lead=lead)
    assert longer.text.startswith("important understand remember ") and longer.tokens == 40


def test_zero_tokens_is_the_empty_text_and_negative_is_refused(tiny: Counter) -> None:
    assert sized_text(0, tiny, random.Random(0), lead=["x"]).text == ""
    with pytest.raises(InvalidArgument, match="must be >= 0 tokens"):
        sized_text(-1, tiny, random.Random(0))


def test_the_workload_has_every_user_and_turn_at_the_target_sizes(count: Counter) -> None:
    s = spec(stagger_s=0.25)
    w = build_workload(s, count, warmup=3)
    assert w.system is not None and w.system.tokens == count(w.system.text) == 120
    assert [c.user for c in w.conversations] == [0, 1, 2, 3]
    assert [c.start_s for c in w.conversations] == [0.0, 0.25, 0.5, 0.75]
    for conv in w.conversations:
        assert len(conv.messages) == 3 and len(conv.think_s) == 2
        assert all(m.tokens == count(m.text) == 20 for m in conv.messages)
        assert all(0.5 <= t <= 1.5 for t in conv.think_s)
    assert len(w.warmup) == 3 and all(m.tokens == 20 for m in w.warmup)
    described = w.describe()
    assert described["measured_tokens"] == {"system": 120, "user_min": 20, "user_max": 20}
    assert (described["users"], described["turns"], described["think_time_s"]) == (4, 3, [0.5, 1.5])


def test_users_differ_right_after_the_system_prompt(tiny: Counter) -> None:
    w = build_workload(spec(users=12), tiny)
    firsts = [c.messages[0].text for c in w.conversations]
    assert len(set(firsts)) == 12
    assert len({text.split(" ")[0] for text in firsts}) == 12  # the first word already differs
    every = [m.text for c in w.conversations for m in c.messages]
    assert len(set(every)) == len(every)


def test_leads_stay_distinct_past_the_pool_size() -> None:
    s = spec(users=len(WORDS) + 5, turns=2)
    leads = {tuple(user_lead(u, t, s)) for u in range(s.users) for t in (1, 2)}
    assert len(leads) == 2 * s.users
    assert max(len(lead) for lead in leads) == 2


def test_the_same_seed_gives_the_same_workload_and_another_seed_another(tiny: Counter) -> None:
    a, b = build_workload(spec(), tiny, warmup=2), build_workload(spec(), tiny, warmup=2)
    assert a == b
    c = build_workload(spec(seed=8), tiny, warmup=2)
    assert c.system != a.system and c.conversations[0].messages != a.conversations[0].messages
    assert c.conversations[0].think_s != a.conversations[0].think_s


def test_a_users_messages_do_not_depend_on_how_many_users_there_are(tiny: Counter) -> None:
    few, many = build_workload(spec(users=2), tiny), build_workload(spec(users=5), tiny)
    assert many.conversations[:2] == few.conversations
    assert many.system == few.system


def test_no_system_prompt_and_a_fixed_think_time(tiny: Counter) -> None:
    w = build_workload(spec(system_tokens=0, think=ThinkTime.parse("2")), tiny)
    assert w.system is None and w.describe()["measured_tokens"]["system"] == 0
    assert all(c.think_s == (2.0, 2.0) for c in w.conversations)


@pytest.mark.parametrize(
    ("text", "parsed"), [("0", (0.0, 0.0)), ("1.5", (1.5, 1.5)), ("0.5:2", (0.5, 2.0)), ("3:3", (3.0, 3.0))]
)
def test_think_times_parse(text: str, parsed: tuple[float, float]) -> None:
    t = ThinkTime.parse(text)
    assert (t.low, t.high) == parsed


@pytest.mark.parametrize("text", ["", "fast", "-1", "2:1", "1:inf", "nan", "1:2:3", ":1"])
def test_bad_think_times_are_refused(text: str) -> None:
    with pytest.raises(InvalidArgument, match="seconds"):
        ThinkTime.parse(text)


@pytest.mark.parametrize(
    "kw",
    [{"users": 0}, {"turns": 0}, {"user_tokens": 0}, {"answer_tokens": 0}, {"system_tokens": -1}, {"stagger_s": -1.0}],
)
def test_bad_parameters_are_refused(kw: dict[str, object]) -> None:
    with pytest.raises(InvalidArgument):
        spec(**kw)


def test_a_negative_warmup_is_refused(tiny: Counter) -> None:
    with pytest.raises(InvalidArgument, match="warm-up"):
        build_workload(spec(), tiny, warmup=-1)
