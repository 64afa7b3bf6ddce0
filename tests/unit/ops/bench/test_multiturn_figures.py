"""Per-turn figures from hand-made records (no process): counts, skipped turns, cached and carried
shares, TTFT percentiles by turn, the modelled uncached TTFT against the round timing table of
timing_factories.py (every expected value worked out by hand in the comments), issue 19's per-run
targets met or missed as the inputs say, and the report's `multiturn` section and its table."""

from __future__ import annotations

import json

import pytest
from rich.console import Console

from calculet.common.errors import InvalidArgument
from calculet.ops.bench.limit import Policy, Serving
from calculet.ops.bench.multiturn.model_cost import uncached_ttft_s
from calculet.ops.bench.multiturn.per_turn import cached_share, turn_stats
from calculet.ops.bench.multiturn.report import multiturn_json
from calculet.ops.bench.multiturn.table import turn_table
from calculet.ops.bench.multiturn.targets import cache_target, ratio_target, ttft_target
from calculet.ops.bench.multiturn.turns import TurnRecord
from calculet.ops.bench.relative import TimingContext

from .factories import failed, record
from .timing_factories import device_model


def turn(user: int, k: int, ttft: float, prompt: int, cached: int | None, out: int = 10, index: int = 0) -> TurnRecord:
    """A completed turn: sent at 10 s, first token `ttft` later, `out` tokens, done a second later."""
    rec = record(10.0, [(10.0 + ttft, out)], 11.0 + ttft, index=index, prompt_tokens=prompt)
    return TurnRecord(user, k, rec, "answer", cached or 0, cached is not None)


def broken(user: int, k: int, index: int = 0) -> TurnRecord:
    return TurnRecord(user, k, failed(index, 10.0, 10.5), "", 0, False)


def three_users() -> list[TurnRecord]:
    """User 0 completes 3 turns; user 1 fails turn 3; user 2 fails turn 1 (turns 2 and 3 skipped)."""
    return [
        turn(0, 1, 0.1, 100, 0, index=0), turn(0, 2, 0.2, 150, 100, index=1), turn(0, 3, 0.4, 200, 150, index=2),
        turn(1, 1, 0.3, 100, 0, index=3), turn(1, 2, 0.05, 150, 140, index=4), broken(1, 3, index=5),
        broken(2, 1, index=6),
    ]  # fmt: skip


def test_counts_shares_and_ttft_by_turn() -> None:
    t1, t2, t3 = turn_stats(three_users(), users=3, turns_per_user=3)
    assert (t1.sent, t1.completed, t1.failed, t1.skipped) == (3, 2, 1, 0)
    assert (t2.sent, t2.completed, t2.failed, t2.skipped) == (2, 2, 0, 1)
    assert (t3.sent, t3.completed, t3.failed, t3.skipped) == (2, 1, 1, 1)
    assert (t1.prompt_tokens, t1.cached_tokens, t1.cached_share, t1.carried_share) == (200, 0, 0.0, 0.0)
    assert (t2.prompt_tokens, t2.cached_tokens) == (300, 240) and t2.cached_share == pytest.approx(0.8)
    # carried by turn 1: min(150, 100 prompt + 10 answer) for each user
    assert t2.carried_tokens == 220 and t2.carried_share == pytest.approx(220 / 300)
    assert (t3.prompt_tokens, t3.cached_tokens, t3.carried_tokens) == (200, 150, 160)
    assert t1.output_tokens == 20 and t3.output_tokens == 10
    # TTFT: turn 1 {0.1, 0.3}: p50 0.2, p90 0.1 + 0.9 * 0.2, p99 0.1 + 0.99 * 0.2
    assert (t1.ttft.count, t1.ttft.p50, t1.ttft.p90, t1.ttft.p99) == (
        2, pytest.approx(0.2), pytest.approx(0.28), pytest.approx(0.298)
    )  # fmt: skip
    # turn 2 {0.2, 0.05}: p50 0.125, p90 0.05 + 0.9 * 0.15, p99 0.05 + 0.99 * 0.15
    assert (t2.ttft.p50, t2.ttft.p90, t2.ttft.p99) == (
        pytest.approx(0.125),
        pytest.approx(0.185),
        pytest.approx(0.1985),
    )
    assert (t3.ttft.count, t3.ttft.p50) == (1, pytest.approx(0.4))


def test_cached_share_over_turns() -> None:
    turns = three_users()
    assert cached_share(turns) == pytest.approx((0 + 240 + 150) / (200 + 300 + 200))
    assert cached_share(turns, first_turn=2) == pytest.approx((240 + 150) / (300 + 200))
    assert cached_share(turns, first_turn=4) is None
    assert cached_share([broken(0, 1)]) is None


def test_a_turn_nobody_reached_has_no_figures() -> None:
    (only,) = turn_stats([broken(0, 1)], users=1, turns_per_user=1)
    assert (only.sent, only.completed, only.failed, only.skipped) == (1, 0, 1, 0)
    assert only.cached_share is None and only.ttft.count == 0 and only.ttft.p50 is None
    second = turn_stats([broken(0, 1)], users=1, turns_per_user=2)[1]
    assert (second.sent, second.skipped) == (0, 1)


# The table of timing_factories.py: t1(L) = 10 + 0.1 L ms, prefill 5 ms + 1 ms a token + attention,
# copies 1 ms a prompt token in and 2 ms a row out, decode step copies 1 + 2 ms a row, batch B x (1 + 0.5 (B - 1)).
@pytest.mark.parametrize(
    ("prompt", "cached", "rows", "expected_ms"),
    [
        # 10 new after 20: in 10, prefill 5 + 10 + 0.1 * (21 + ... + 30) = 40.5, out 2; step at 31: 13.1 + 3
        (30, 20, 1, 68.6),
        # the same on 2 rows (batch 2): step 13.1 * 1.5 = 19.65, copies 2 + 4
        (30, 20, 2, 78.15),
        # nothing cached: in 10, prefill 5 + 10 + 0.1 * 55 = 20.5, out 2; step at 11: 11.1 + 3
        (10, 0, 1, 46.6),
        # all cached: one token is still prefilled, after 29: in 1, 5 + 1 + 3.0, out 2; step at 31: 13.1 + 3
        (30, 30, 1, 28.1),
    ],
)
def test_the_modelled_uncached_ttft(prompt: int, cached: int, rows: int, expected_ms: float) -> None:
    assert uncached_ttft_s(device_model(), prompt, cached, rows) * 1000 == pytest.approx(expected_ms)


@pytest.mark.parametrize(("prompt", "cached", "rows"), [(0, 0, 1), (5, -1, 1), (5, 0, 0), (5, 0, 3)])
def test_the_modelled_cost_refuses_impossible_inputs(prompt: int, cached: int, rows: int) -> None:
    with pytest.raises(InvalidArgument):
        uncached_ttft_s(device_model(), prompt, cached, rows)


def timing(scale: float) -> TimingContext:
    # one lane: rows are 1 whatever the load
    return TimingContext("pkg", device_model(batches=(1,), lanes=1), Serving(Policy.CONTINUOUS, 2), scale, 1)


@pytest.mark.parametrize(("ttft_2", "met"), [(0.2, True), (0.25, False)])
def test_the_section_relates_later_turns_to_the_model(ttft_2: float, met: bool) -> None:
    turns = [turn(0, 1, 0.1, 10, 0, index=0), turn(0, 2, ttft_2, 30, 20, index=1)]
    mt = json.loads(json.dumps(multiturn_json(turns, 1, 2, timing(2.0), duration_s=5.0)))
    # modelled at time scale 2: turn 1 46.6 ms -> 93.2, turn 2 68.6 ms -> 137.2; bound 1.2 * 137.2 + 50
    assert [row["modelled_uncached_ttft_ms"] for row in mt["per_turn"]] == [pytest.approx(93.2), pytest.approx(137.2)]
    later = mt["later_turns"]
    assert later["requests"] == 1 and later["ttft_p50_ms"] == pytest.approx(ttft_2 * 1000)
    assert later["modelled_uncached_ttft_p50_ms"] == pytest.approx(137.2)
    assert later["ttft_bound_ms"] == pytest.approx(214.64)
    cache, ttft = mt["targets"]
    assert (cache["name"], cache["measured"], cache["met"]) == ("cache", pytest.approx(20 / 30), False)
    assert (ttft["name"], ttft["measured"], ttft["unit"], ttft["met"]) == ("ttft", pytest.approx(ttft_2), "s", met)
    assert mt["cached_share"] == pytest.approx(20 / 40) and mt["cached_share_later"] == pytest.approx(20 / 30)


def test_the_section_without_a_timing_model() -> None:
    mt = multiturn_json(three_users(), 3, 3, None, duration_s=2.0)
    assert (mt["users"], mt["turns"], mt["skipped"], mt["cache_reported"]) == (3, 3, 2, 5)
    assert [row["turn"] for row in mt["per_turn"]] == [1, 2, 3]
    assert [row["sent"] for row in mt["per_turn"]] == [3, 2, 2]
    assert mt["per_turn"][1]["ttft_ms"]["p50"] == pytest.approx(125.0)
    assert mt["per_turn"][1]["modelled_uncached_ttft_ms"] is None
    # later turns pooled: TTFT {0.2, 0.05, 0.4}, p50 0.2; cached (240 + 150) / 500
    assert mt["later_turns"]["ttft_p50_ms"] == pytest.approx(200.0) and mt["later_turns"]["ttft_bound_ms"] is None
    cache, ttft = mt["targets"]
    assert cache["measured"] == pytest.approx(0.78) and cache["met"] is False
    assert ttft["met"] is None and "--timing-package" in ttft["detail"]
    text = render(mt)
    assert "78.0 % from turn 2" in text and "missed" in text and "not checked" in text


def test_a_run_serving_every_later_prompt_from_cache_meets_the_cache_target() -> None:
    turns = [turn(0, 1, 0.1, 100, 0, index=0), turn(0, 2, 0.1, 200, 190, index=1), turn(0, 3, 0.1, 300, 270, index=2)]
    cache = multiturn_json(turns, 1, 3, None, duration_s=1.0)["targets"][0]
    assert cache["measured"] == pytest.approx(460 / 500) and cache["met"] is True


def test_a_gateway_that_does_not_report_cached_tokens_is_said_so() -> None:
    mt = multiturn_json([turn(0, 1, 0.1, 100, None)], 1, 1, None, duration_s=1.0)
    assert mt["cache_reported"] == 0 and mt["cached_share"] == 0.0
    assert "carried no prompt_tokens_details.cached_tokens" in render(mt)


def render(mt: dict[str, object]) -> str:
    console = Console(width=200, record=True)
    console.print(turn_table({"multiturn": mt}))
    return console.export_text()


@pytest.mark.parametrize(("share", "met"), [(0.9, True), (0.95, True), (0.8999, False), (None, None)])
def test_the_cache_target_threshold(share: float | None, met: bool | None) -> None:
    assert cache_target(share).met is met


@pytest.mark.parametrize(
    ("ttft", "modelled", "met"),
    [(0.1699, 0.1, True), (0.1701, 0.1, False), (0.05, 0.0, True), (0.3, None, None), (None, 0.1, None)],
)
def test_the_ttft_target_bound(ttft: float | None, modelled: float | None, met: bool | None) -> None:
    assert ttft_target(ttft, modelled).met is met  # bound 1.2 * modelled + 0.05


@pytest.mark.parametrize(
    ("num", "den", "measured", "met"),
    [(300.0, 100.0, 3.0, True), (299.0, 100.0, 2.99, False), (None, 1.0, None, None), (5.0, 0.0, None, None)],
)
def test_ratio_targets(num: float | None, den: float | None, measured: float | None, met: bool | None) -> None:
    target = ratio_target("reuse", "on >= 3 x off", num, den, 3.0)
    assert target.met is met and (target.measured == pytest.approx(measured) if measured else target.measured is None)


def test_a_later_turn_below_its_previous_prompts_full_blocks_missed_its_lane() -> None:
    turns = [
        turn(0, 1, 0.1, 1113, 0, index=0), turn(0, 2, 0.2, 1257, 1088, index=1),  # 17 blocks held: hit
        turn(0, 3, 0.2, 1400, 1087, index=2),  # 1,257 -> 19 blocks = 1,216 held, 1,087 served: missed
        turn(1, 1, 0.1, 1113, 0, index=3), turn(1, 2, 6.0, 1257, 0, index=4),  # cold elsewhere: missed
        broken(2, 1, index=5),
    ]  # fmt: skip
    t1, t2, t3 = turn_stats(turns, users=3, turns_per_user=3)
    assert (t1.missed, t2.missed, t3.missed) == (0, 1, 1)
    mt = multiturn_json(turns, 3, 3, None, 10.0)
    assert [row["missed"] for row in mt["per_turn"]] == [0, 1, 1]
    assert (mt["later_turns"]["missed"], mt["later_turns"]["requests"]) == (2, 3)
    console = Console(width=200, record=True)
    console.print(turn_table({"multiturn": mt}))
    assert "2 of 3 later turns missed their lane" in console.export_text()
