"""The router's scorers and policies on plain data (no fleet, no event loop): each scorer's
estimate, the cached-prefix count, their sum, the near-tie margin and its tie-breakers (session
affinity, then the fewest jobs per lane, random only among equals), the load-only policy, the
turnover average and the fallback prefill cost."""

from __future__ import annotations

import logging
import random
from collections import Counter
from dataclasses import replace

import pytest

from calculet.client.types import ModelInfo, ModelState
from calculet.common.prefix import BLOCK_TOKENS, block_hashes
from calculet.gateway.fleet.packages import FALLBACK_PREFILL_MS_PER_TOKEN, ModelCosts
from calculet.gateway.routing.load_policy import LoadPolicy
from calculet.gateway.routing.policy import affinity
from calculet.gateway.routing.scoring.estimate import SCORERS, estimate_ms
from calculet.gateway.routing.scoring.inputs import BoardView, RouteRequest
from calculet.gateway.routing.scoring.lane_wait import lane_wait_ms
from calculet.gateway.routing.scoring.own_prefill import own_prefill_ms
from calculet.gateway.routing.scoring.prefix import cached_tokens, uncached_tokens
from calculet.gateway.routing.scoring.work_ahead import work_ahead_ms
from calculet.gateway.routing.ttft_policy import TtftPolicy, break_tie, near_ties
from calculet.gateway.routing.turnover import DEFAULT_TURNOVER_MS, Turnover

PROMPT = [(i * 7919) % 50_000 for i in range(300)]  # 4 full blocks + 44 tokens
REQUEST = RouteRequest.build("m", "pkg", PROMPT)
IDLE = BoardView(
    target="b0", lanes=16, jobs=0, own_jobs=0, pending_tokens=0, prefix_hashes=frozenset(),
    fixed_ms=20.0, per_token_ms=0.5, turnover_ms=8000.0,
)  # fmt: skip


def board(**changes: object) -> BoardView:
    return replace(IDLE, **changes)  # type: ignore[arg-type]


def holding(blocks: int, **changes: object) -> BoardView:
    """A board whose lanes hold the first `blocks` blocks of PROMPT (and something unrelated)."""
    held = frozenset(REQUEST.block_hashes[:blocks]) | {12345}
    return board(prefix_hashes=held, **changes)


def test_route_request_hashes_full_blocks_and_continues_them() -> None:
    assert REQUEST.tokens == 300 and len(REQUEST.block_hashes) == 300 // BLOCK_TOKENS == 4
    assert list(REQUEST.block_hashes) == block_hashes(PROMPT)
    streamed = [5, 6, 7] * 30  # a failover resubmits prompt + streamed tokens
    continued = REQUEST.continued([*PROMPT, *streamed])
    assert continued == RouteRequest.build("m", "pkg", [*PROMPT, *streamed])
    assert continued.tokens == 390 and len(continued.block_hashes) == 6


@pytest.mark.parametrize(
    ("blocks", "expected"),
    [(0, 0), (1, 64), (3, 192), (4, 256)],
)
def test_cached_tokens_count_the_run_of_held_blocks_from_block_0(blocks: int, expected: int) -> None:
    view = holding(blocks)
    assert cached_tokens(REQUEST, view) == expected
    assert uncached_tokens(REQUEST, view) == 300 - expected


def test_a_later_block_without_the_first_is_no_prefix() -> None:
    view = board(prefix_hashes=frozenset(REQUEST.block_hashes[1:]))
    assert cached_tokens(REQUEST, view) == 0


def test_a_prompt_that_continues_a_lane_counts_through_its_tip_even_unadvertised() -> None:
    tip = REQUEST.block_hashes[2]  # a lane holding blocks 0..2 of PROMPT: this request continues it
    view = board(prefix_hashes=frozenset(REQUEST.block_hashes[:1]), prefix_tips=frozenset({tip}), cold_lanes=5)
    assert cached_tokens(REQUEST, view) == 3 * BLOCK_TOKENS, "the tip proves blocks 0..2 are held"


def test_a_stranger_sharing_only_a_prefix_is_counted_cold_while_a_lane_is_free() -> None:
    other = RouteRequest.build("m", "pkg", [*PROMPT[:192], *range(90_000, 90_300)])  # another conversation
    shared = frozenset(other.block_hashes)  # its lane holds PROMPT's first 3 blocks, then its own
    tips = frozenset({other.block_hashes[-1]})
    assert cached_tokens(REQUEST, board(prefix_hashes=shared, prefix_tips=tips, cold_lanes=1)) == 0
    full = board(prefix_hashes=shared, prefix_tips=tips, cold_lanes=0)  # a parked lane must go anyway
    assert cached_tokens(REQUEST, full) == 3 * BLOCK_TOKENS
    assert cached_tokens(REQUEST, board(prefix_hashes=shared, cold_lanes=1)) == 192, "no tips: the plain run"


def test_the_last_token_is_always_prefilled() -> None:
    exact = RouteRequest.build("m", "pkg", PROMPT[:128])  # exactly two blocks, both held
    view = board(prefix_hashes=frozenset(exact.block_hashes))
    assert cached_tokens(exact, view) == 127 and uncached_tokens(exact, view) == 1
    one = RouteRequest.build("m", "pkg", [9])
    assert cached_tokens(one, view) == 0 and uncached_tokens(one, view) == 1


def test_a_short_request_waits_only_for_the_short_prefills_pending() -> None:
    busy = board(pending_tokens=12_000, pending_short_tokens=400, short_tokens=512)  # long first turns queued
    assert work_ahead_ms(REQUEST, busy) == 400 * 0.5, "300 uncached tokens <= 512: served before the long work"
    assert work_ahead_ms(REQUEST, holding(4, **vars_of(busy))) == 200.0  # 44 uncached: short too
    long_request = RouteRequest.build("m", "pkg", list(range(600)))
    assert work_ahead_ms(long_request, busy) == 12_000 * 0.5, "a long request waits for all of it"
    assert work_ahead_ms(REQUEST, board(pending_tokens=12_000, pending_short_tokens=400)) == 6000.0, "no bound"


def vars_of(view: BoardView) -> dict[str, object]:
    return {k: getattr(view, k) for k in ("pending_tokens", "pending_short_tokens", "short_tokens")}


def test_work_ahead_is_pending_tokens_at_the_prefill_cost() -> None:
    assert work_ahead_ms(REQUEST, IDLE) == 0.0
    assert work_ahead_ms(REQUEST, board(pending_tokens=1000)) == 500.0
    assert work_ahead_ms(REQUEST, board(pending_tokens=1000, per_token_ms=2.0)) == 2000.0


def test_own_prefill_is_fixed_plus_uncached_tokens() -> None:
    assert own_prefill_ms(REQUEST, IDLE) == 20.0 + 300 * 0.5
    assert own_prefill_ms(REQUEST, holding(3)) == 20.0 + (300 - 192) * 0.5
    assert own_prefill_ms(REQUEST, holding(4, fixed_ms=0.0)) == (300 - 256) * 0.5


@pytest.mark.parametrize(
    ("jobs", "expected_ms"),
    [(0, 0.0), (15, 0.0), (16, 1 / 16 * 8000.0), (17, 2 / 16 * 8000.0), (32, 17 / 16 * 8000.0)],
)
def test_lane_wait_is_zero_with_a_free_lane_else_the_place_in_line_times_turnover(
    jobs: int, expected_ms: float
) -> None:
    assert lane_wait_ms(REQUEST, board(jobs=jobs)) == pytest.approx(expected_ms)


def test_the_estimate_is_the_sum_of_the_scorers() -> None:
    view = holding(2, jobs=17, pending_tokens=400)
    terms = (400 * 0.5, 20.0 + (300 - 128) * 0.5, 2 / 16 * 8000.0)
    assert [s(REQUEST, view) for s in SCORERS] == pytest.approx(list(terms))
    assert estimate_ms(REQUEST, view) == pytest.approx(sum(terms))
    assert estimate_ms(REQUEST, view, [lane_wait_ms]) == pytest.approx(terms[2])


def test_near_ties_are_within_5_percent_or_5_ms_of_the_best() -> None:
    a, b, c, d = (board(target=t) for t in "abcd")
    assert near_ties([(1000.0, a), (1049.0, b), (1051.0, c)]) == [a, b]  # 5 % of 1000 = 50 ms
    assert near_ties([(10.0, a), (14.9, b), (15.1, c), (9.0, d)]) == [a, d]  # 5 ms beats 5 % of 9
    assert near_ties([(0.0, a), (5.0, b), (5.5, c)]) == [a, b]


def test_a_session_breaks_near_ties_by_rendezvous_hash() -> None:
    near = [board(target=f"b{i}") for i in range(4)]
    rng = random.Random(0)
    for s in range(20):
        session = f"s{s}"
        home = max(near, key=lambda v: affinity(session, v.target))
        assert {break_tie(near, session, rng).target for _ in range(5)} == {home.target}
        assert break_tie(list(reversed(near)), session, rng) is home  # order does not matter


def test_without_a_session_the_fewest_jobs_per_lane_win_random_among_equals() -> None:
    busy, light1, light2 = board(target="busy", jobs=8), board(target="l1", jobs=2), board(target="l2", jobs=2)
    small = board(target="small", lanes=4, jobs=1)  # 1/4 > 2/16
    rng = random.Random(7)
    got = Counter(break_tie([busy, light1, small, light2], "", rng).target for _ in range(200))
    assert set(got) == {"l1", "l2"} and min(got.values()) > 50


def test_ttft_policy_prefers_the_board_holding_the_prefix_until_it_costs_more() -> None:
    policy = TtftPolicy(random.Random(1))
    cold = [board(target=f"cold{i}") for i in range(3)]
    warm = holding(4, target="warm")  # saves 256 tokens = 128 ms
    assert {policy.choose(REQUEST, [*cold, warm]).target for _ in range(20)} == {"warm"}
    # Its lanes full: a lane frees in about turnover / lanes = 500 ms > the saving.
    full = holding(4, target="warm", jobs=16)
    assert "warm" not in {policy.choose(REQUEST, [*cold, full]).target for _ in range(20)}
    # Prefill work queued there: 300 tokens (150 ms) outweigh the saving; 200 (100 ms) do not.
    assert "warm" not in {policy.choose(REQUEST, [*cold, holding(4, target="warm", pending_tokens=300)]).target
                          for _ in range(20)}  # fmt: skip
    assert policy.choose(REQUEST, [*cold, holding(4, target="warm", pending_tokens=200)]).target == "warm"


def test_ttft_policy_randomness_only_among_near_ties() -> None:
    policy = TtftPolicy(random.Random(3))
    views = [board(target="a"), board(target="b"), board(target="c", pending_tokens=20)]  # c: +10 ms
    got = Counter(policy.choose(REQUEST, views).target for _ in range(200))
    assert set(got) == {"a", "b"} and min(got.values()) > 50
    session = RouteRequest.build("m", "pkg", PROMPT, session="user-1")
    assert len({policy.choose(session, views).target for _ in range(20)}) == 1


def test_ttft_policy_logs_why_at_debug(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="calculet.gateway.routing.ttft_policy")
    chosen = TtftPolicy(random.Random(1)).choose(REQUEST, [board(target="cold"), holding(4, target="warm")])
    (line,) = [r.getMessage() for r in caplog.records]
    assert chosen.target == "warm" and "-> warm" in line
    assert "warm est 42 ms cached 256" in line and "cold est 170 ms cached 0" in line, line


def test_load_policy_ignores_prefixes_and_prefill_work() -> None:
    policy = LoadPolicy(random.Random(2))
    warm = holding(4, target="warm", jobs=8, pending_tokens=0)
    cold = board(target="cold", jobs=2, pending_tokens=5000)
    assert {policy.choose(REQUEST, [warm, cold]).target for _ in range(20)} == {"cold"}
    assert policy.rank(REQUEST, warm) == 0.5 and policy.rank(REQUEST, cold) == 2 / 16
    assert TtftPolicy().rank(REQUEST, cold) == estimate_ms(REQUEST, cold)


def test_load_policy_session_sticks_while_its_board_has_room() -> None:
    policy = LoadPolicy(random.Random(2))
    views = [board(target=f"b{i}") for i in range(4)]
    request = RouteRequest.build("m", "pkg", PROMPT, session="user-9")
    home = max(views, key=lambda v: affinity("user-9", v.target))
    assert {policy.choose(request, views).target for _ in range(10)} == {home.target}
    crowded = [replace(v, jobs=16) if v is home else v for v in views]
    assert home.target not in {policy.choose(request, crowded).target for _ in range(20)}


def test_turnover_is_an_ewma_per_alias_with_a_default() -> None:
    turnover = Turnover()
    assert turnover.ms("m") == DEFAULT_TURNOVER_MS == 10_000.0
    turnover.observe("m", 2.0)
    assert turnover.ms("m") == 2000.0  # the first observation replaces the default
    turnover.observe("m", 7.0)
    assert turnover.ms("m") == pytest.approx(2000.0 + 0.2 * 5000.0)
    assert turnover.ms("other") == DEFAULT_TURNOVER_MS
    turnover.observe("m", -1.0)  # a clock oddity counts as 0
    assert turnover.ms("m") == pytest.approx(3000.0 * 0.8)


def _info(**costs: float) -> ModelInfo:
    return ModelInfo(
        alias="m", generation=1, state=ModelState.READY, package_name="p", package_hash="h", family="f",
        quantization="q", vocab_size=10, context=10, lanes=1, eos_token_ids=(), bos_token_id=None,
        pad_token_id=None, model_max_length=10, tokenizer_json=b"", chat_template="", **costs,  # type: ignore[arg-type]
    )  # fmt: skip


def test_model_costs_fall_back_when_the_package_declares_none() -> None:
    undeclared = ModelCosts.of(_info())
    assert undeclared.prefill_ms_per_token == FALLBACK_PREFILL_MS_PER_TOKEN == 1.0
    assert undeclared.prefill_fixed_ms == 0.0 and not undeclared.declared
    declared = ModelCosts.of(_info(prefill_fixed_ms=17.0, prefill_ms_per_token=4.5, decode_step_ms=17.0))
    assert (declared.prefill_fixed_ms, declared.prefill_ms_per_token, declared.declared) == (17.0, 4.5, True)
