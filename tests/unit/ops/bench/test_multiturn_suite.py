"""`calctl bench suite --multiturn` without processes: the comparison's fleets and their flags, the
sizes and users, the estimate against the round timing table of timing_factories.py (worked out by
hand below), the `calctl bench` command of a run, issue 19's targets across hand-made run records,
the markdown report, and the flags (every bad one a usage error, exit 2; the canonical command)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from calculet.common.errors import InvalidArgument
from calculet.ops.bench.multiturn.workload import ThinkTime
from calculet.ops.bench.suite.multiturn import ComparisonFleet, MultiturnSizes, comparison_fleets, select
from calculet.ops.bench.suite.multiturn_estimate import estimate
from calculet.ops.bench.suite.multiturn_report import render_multiturn_markdown
from calculet.ops.bench.suite.multiturn_runner import ComparisonPlan, bench_argv, run_record
from calculet.ops.bench.suite.multiturn_targets import device_rate, suite_targets
from calculet.ops.bench.suite.packages import SuitePackage
from calculet.ops.bench.suite.runner import SuiteContext
from calculet.ops.calctl import build_parser, main
from calculet.ops.commands.bench_suite import suite_command
from tests.unit.ops.calctl_fakes import usage_error

from .timing_factories import device_model

SIZES = MultiturnSizes(0.75, 2, 0, 5, 2, ThinkTime(0.0, 0.0))


def test_the_comparison_has_reuse_off_and_on_and_both_routings_on_several_boards() -> None:
    fleets = comparison_fleets((1, 4))
    assert [f.name for f in fleets] == [
        "mt-x1-off-load", "mt-x1-on-load", "mt-x4-off-load", "mt-x4-on-load", "mt-x4-on-prefix"
    ]  # fmt: skip
    on4 = fleets[-1]
    assert on4.daemon_flags() == ("--prefix-reuse", "on") and on4.gateway_flags() == ("--routing", "prefix")
    assert fleets[0].daemon_flags() == ("--prefix-reuse", "off") and fleets[0].gateway_flags() == ("--routing", "load")
    spec = on4.spec(16)
    assert (spec.boards, spec.max_inflight, spec.decode_batch, spec.policy.value) == (4, 2, 16, "continuous")


def test_selecting_fleets_by_name() -> None:
    fleets = comparison_fleets((1, 2))
    assert [f.name for f in select(fleets, frozenset({"mt-x2-on-prefix", "mt-x1-off-load"}))] == [
        "mt-x1-off-load", "mt-x2-on-prefix"
    ]  # fmt: skip
    with pytest.raises(InvalidArgument, match=r"unknown configuration mt-x4-on-load \(this comparison has: mt-x1"):
        select(fleets, frozenset({"mt-x4-on-load"}))


def test_users_follow_the_lanes_and_boards() -> None:
    assert SIZES.users_for(16, 1) == 12 and SIZES.users_for(16, 4) == 48
    assert SIZES.users_for(1, 1) == 1  # round(0.75) = 1, and never fewer than one
    assert MultiturnSizes(0.1, 1, 0, 1, 1, ThinkTime(0, 0)).users_for(2, 1) == 1


def test_prompt_sizes_and_the_lane_check() -> None:
    # no system prompt; turn 1: one user message (5 + 5) and the generation prompt (5) = 15;
    # turn 2: two user messages (20), one answer (2 + 5), the generation prompt (5) = 32
    assert (SIZES.prompt_tokens(1), SIZES.prompt_tokens(2)) == (15, 32)
    with_system = MultiturnSizes(0.75, 2, 100, 5, 2, ThinkTime(0, 0))
    assert with_system.prompt_tokens(1) == 15 + 105
    SIZES.check_fits(34)  # 32 + the 2-token answer
    # 3-token answers: turn 2's prompt is 20 + (3 + 5) + 5 = 33, and its answer 3 more
    with pytest.raises(InvalidArgument, match=r"the last turn needs about 36 tokens .* holds 34"):
        MultiturnSizes(0.75, 2, 0, 5, 3, ThinkTime(0, 0)).check_fits(34)


@pytest.mark.parametrize(
    "kw", [{"users_per_lane": 0.0}, {"turns": 0}, {"user_tokens": 0}, {"answer_tokens": 0}, {"system_tokens": -1}]
)
def test_bad_sizes_are_refused(kw: dict[str, Any]) -> None:
    base: dict[str, Any] = dict(users_per_lane=1.0, turns=1, system_tokens=0, user_tokens=1, answer_tokens=1)
    with pytest.raises(InvalidArgument):
        MultiturnSizes(**(base | kw), think=ThinkTime(0, 0))


def test_the_estimate_by_hand() -> None:
    """One user on one board (rows 1, batch 1). Turn 1 (15 prompt, 2 answer): copies 15 + 2 ms, prefill
    5 + 15 + 0.1 * (1 + .. + 15) = 32 ms, one decode step at 16: 11.6 + 3 ms -> 63.6 ms. Turn 2 without
    reuse (32 from scratch): copies 34, prefill 5 + 32 + 0.1 * 528 = 89.8, step at 33: 13.3 + 3 -> 140.1
    ms; with reuse (15 after 17): copies 17, prefill 5 + 15 + 0.1 * (17 * 15 + 120) = 57.5, step 16.3 ->
    90.8 ms."""
    model = device_model()
    off = estimate(ComparisonFleet(1, False, "load"), SIZES, model, users=1)
    on = estimate(ComparisonFleet(1, True, "load"), SIZES, model, users=1)
    assert off.modelled_s == pytest.approx(0.0636 + 0.1401)
    assert on.modelled_s == pytest.approx(0.0636 + 0.0908)
    assert off.fleet_tokens_per_s == pytest.approx(4 / 0.2037)  # 2 turns x 2 answer tokens
    assert off.longest_job_s == on.longest_job_s == pytest.approx(0.034 + 0.0898)
    assert (on.users, on.think_s) == (1, 0.0)


def test_the_estimate_shares_decode_steps_and_spreads_users_over_boards() -> None:
    model = device_model()  # 2 lanes, batches 1 and 2
    sizes = MultiturnSizes(1.0, 2, 0, 5, 2, ThinkTime(1.0, 3.0))
    one = estimate(ComparisonFleet(1, True, "load"), sizes, model, users=1)
    two = estimate(ComparisonFleet(1, True, "load"), sizes, model, users=2)
    # two users on one board: prefills twice, decode steps on batch 2 (x 1.5, copies x 2) shared by 2 rows
    prefill = 0.017 + 0.032 + 0.017 + 0.0575
    assert two.modelled_s == pytest.approx(2 * prefill + (0.0116 * 1.5 + 0.006) + (0.0133 * 1.5 + 0.006))
    assert one.modelled_s == pytest.approx(prefill + 0.0146 + 0.0163)
    spread = estimate(ComparisonFleet(2, True, "prefix"), sizes, model, users=2)
    assert spread.modelled_s == pytest.approx(one.modelled_s)  # one user a board
    assert spread.think_s == 2.0 and spread.wall_s(0.5) == pytest.approx(one.modelled_s * 0.5 + 2.0)


def plan(fleet: ComparisonFleet, tmp_path: Path, slo: str | None = None) -> ComparisonPlan:
    model = device_model()
    package = SuitePackage("tiny-b2", tmp_path / "tiny-b2", model, 512)
    est = estimate(fleet, SIZES, model, users=3)
    return ComparisonPlan(fleet, package, 0.5, est, SIZES, ("--log-level", "DEBUG"), ("--log-format", "json"), slo)


def context(tmp_path: Path) -> SuiteContext:
    return SuiteContext(tmp_path, tmp_path / "models", "tiny", 7, lambda argv: (None, {}), print)  # type: ignore[arg-type,return-value]


def test_a_run_is_one_multiturn_bench_with_the_fleets_flags(tmp_path: Path) -> None:
    p = plan(ComparisonFleet(2, True, "prefix"), tmp_path, slo="ttft:500")
    assert p.run_name == "mt-x2-on-prefix.multiturn.u3.gateway" and p.warmup == 3
    daemon = p.daemon_flags()
    assert daemon[:2] == ("--max-inflight", "2") and "--job-timeout" in daemon
    assert daemon[-4:] == ("--prefix-reuse", "on", "--log-level", "DEBUG")
    assert p.gateway_flags() == ("--routing", "prefix", "--log-format", "json")
    argv = bench_argv(p, "http://127.0.0.1:9000", context(tmp_path))
    assert argv[:7] == ["bench", "--gateway", "http://127.0.0.1:9000", "--model", "tiny", "--workload", "multiturn"]
    flags = dict(zip(argv[7::2], argv[8::2], strict=False))
    assert {k: flags[k] for k in ("--users", "--turns", "--system-tokens", "--user-tokens", "--answer-tokens")} == {
        "--users": "3", "--turns": "2", "--system-tokens": "0", "--user-tokens": "5", "--answer-tokens": "2"
    }  # fmt: skip
    assert (flags["--think-time"], flags["--warmup"], flags["--seed"], flags["--time-scale"]) == ("0", "3", "7", "0.5")
    assert flags["--timing-package"] == str(tmp_path / "tiny-b2") and argv[-2:] == ["--slo", "ttft:500"]
    assert "--no-progress" in argv
    parsed = build_parser().parse_args(argv)  # the bench command takes it
    assert parsed.workload == "multiturn" and parsed.users == 3
    record = run_record(p, "calctl bench ...")
    assert (record["config"], record["boards"], record["prefix_reuse"], record["routing"]) == (
        "mt-x2-on-prefix", 2, True, "prefix"
    )  # fmt: skip
    assert (record["requests"], record["concurrency"], record["workload"]["users"]) == (6, 3, 3)


def run(config: str, boards: int, reuse: bool, routing: str, tok_s: float | None, scale: float = 0.5) -> dict[str, Any]:
    """A run record whose report carries only what the targets and the report read."""
    report = None
    if tok_s is not None:
        targets = [
            {"name": "cache", "wanted": "w", "measured": 0.95 if reuse else 0.0, "unit": "share",
             "met": reuse, "detail": "d"},
            {"name": "ttft", "wanted": "w", "measured": 0.1, "unit": "s", "met": None, "detail": "d"},
        ]  # fmt: skip
        report = {
            "counts": {"completed": 6, "failed": 0},
            "throughput": {"output_tokens_per_s": tok_s, "requests_per_s": 1.0},
            "multiturn": {
                "skipped": 0, "cached_share": 0.5, "cached_share_later": 0.95 if reuse else 0.0,
                "later_turns": {"ttft_p50_ms": 100.0, "modelled_uncached_ttft_p50_ms": 50.0},
                "per_turn": [
                    {"turn": 1, "sent": 3, "skipped": 0, "completed": 3, "prompt_tokens": 100, "carried_tokens": 0,
                     "cached_share": 0.0, "carried_share": 0.0, "ttft_ms": {"p50": 200.0, "p90": 210.0, "p99": 220.0},
                     "modelled_uncached_ttft_ms": 80.0},
                    {"turn": 2, "sent": 3, "skipped": 0, "completed": 3, "prompt_tokens": 200, "carried_tokens": 190,
                     "cached_share": 0.9, "carried_share": 0.95, "ttft_ms": {"p50": 100.0, "p90": 110.0, "p99": 120.0},
                     "modelled_uncached_ttft_ms": 50.0},
                ],
                "targets": targets,
            },
        }  # fmt: skip
    name = f"{config}.multiturn.u3.gateway"
    return {
        "name": name, "config": config, "boards": boards, "prefix_reuse": reuse, "routing": routing,
        "time_scale": scale, "report": report, "command": f"calctl bench # {config}", "error": None, "host_cpu": None,
    }  # fmt: skip


def test_targets_compare_the_runs_in_device_time() -> None:
    records = [
        run("mt-x1-off-load", 1, False, "load", 20.0),
        run("mt-x1-on-load", 1, True, "load", 70.0),
        run("mt-x4-off-load", 4, False, "load", 80.0, scale=1.0),
        run("mt-x4-on-load", 4, True, "load", 150.0, scale=1.0),
        run("mt-x4-on-prefix", 4, True, "prefix", 130.0, scale=1.0),
    ]
    assert device_rate(records[0]) == 10.0 and device_rate(records[4]) == 130.0
    by = {(t["name"], t["runs"]): t for t in suite_targets(records)}
    assert [k for k in by if k[0] == "cache"] == [
        ("cache", "mt-x1-on-load"), ("cache", "mt-x4-on-load"), ("cache", "mt-x4-on-prefix")
    ]  # fmt: skip
    reuse1 = by[("reuse", "mt-x1-on-load / mt-x1-off-load")]
    assert (reuse1["measured"], reuse1["met"]) == (pytest.approx(3.5), True)  # 35 / 10 tokens per device second
    reuse4 = by[("reuse", "mt-x4-on-prefix / mt-x4-off-load")]  # prefix routing, not load
    assert (reuse4["measured"], reuse4["met"]) == (pytest.approx(130 / 80), False)
    scaling = by[("scaling", "mt-x4-on-prefix / mt-x1-on-load")]
    assert (scaling["measured"], scaling["met"]) == (pytest.approx(130 / 35), True)  # >= 3.6
    assert "3.6 x" in scaling["wanted"]


def test_a_missing_or_failed_run_leaves_its_targets_unchecked() -> None:
    records = [run("mt-x1-off-load", 1, False, "load", None), run("mt-x1-on-load", 1, True, "load", 70.0)]
    (cache, ttft, reuse) = suite_targets(records)
    assert (cache["name"], ttft["name"]) == ("cache", "ttft")
    assert (reuse["name"], reuse["measured"], reuse["met"]) == ("reuse", None, None)
    assert all(t["name"] != "scaling" for t in suite_targets(records))  # one fleet size: nothing to scale


def test_the_markdown_report() -> None:
    runs = [run("mt-x1-off-load", 1, False, "load", 20.0), run("mt-x1-on-load", 1, True, "load", 70.0)]
    configs = [
        {"name": r["config"], "boards": 1, "prefix_reuse": r["prefix_reuse"], "routing": "load", "users": 3,
         "package": "tiny-b2", "time_scale": 0.5, "daemon_flags": ["--prefix-reuse", "on"],
         "gateway_flags": ["--routing", "load"], "error": None}
        for r in runs
    ]  # fmt: skip
    doc = {
        "command": "calctl bench suite --multiturn", "preset": "tiny", "host": {"cpus": 2},
        "time_scale_rule": "--time-scale 0.5 for every fleet.", "runs": runs, "configs": configs,
        "multiturn": SIZES.describe(),
    }  # fmt: skip
    text = render_multiturn_markdown(doc)
    assert text.startswith("# calctl bench suite: multi-turn comparison (issue 19), tiny")
    assert "0.75 users per KV lane, 2 turns, a 0-token system prompt, 5 user tokens and 2-token answers" in text
    assert (
        "| reuse | mt-x1-on-load / mt-x1-off-load | x1: output tokens/s with reuse on >= 3 x reuse off | 3.50 x | met |"
        in text
    )
    assert "| cache | mt-x1-off-load" not in text  # reuse off is not held to the cache target
    assert (
        "| mt-x1-on-load | 6 / 0 / 0 | 70.0 | 35.0 | 1.00 | n/a | 50.0 % / 95.0 % | 95.0 % | 200.0 | 100.0 | 50.0 |"
        in text
    )
    assert "| mt-x1-on-load | 2 | 3 / 3 | 100.0 / 110.0 / 120.0 | 90.0 % | 95.0 % | 50.0 |" in text
    assert "calctl bench # mt-x1-off-load" in text


GOOD = ("bench", "suite", "--multiturn", "--preset", "tiny")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ((*GOOD, "--quick"), "--quick: not with --multiturn"),
        ((*GOOD, "--concurrency", "4", "--requests", "3"), "--concurrency, --requests: not with --multiturn"),
        ((*GOOD, "--workloads", "short"), "--workloads: not with --multiturn"),
        (("bench", "suite", "--turns", "3"), "--turns: only with --multiturn"),
        (("bench", "suite", "--boards", "1,2", "--slo", "ttft:5"), "--boards: only with --multiturn"),
        ((*GOOD, "--boards", "0,4"), "argument --boards: '0,4': every board count must be in 1..16"),
        ((*GOOD, "--boards", "4,4"), "argument --boards: '4,4': a board count is given twice"),
        ((*GOOD, "--boards", "one"), "expected board counts separated by commas"),
        ((*GOOD, "--users-per-lane", "0"), "argument --users-per-lane: '0': must be a number > 0"),
        ((*GOOD, "--turns", "0"), "argument --turns: '0': must be at least 1"),
        ((*GOOD, "--system-tokens", "-1"), "argument --system-tokens: '-1': must be at least 0"),
        ((*GOOD, "--answer-tokens", "x"), "argument --answer-tokens: 'x': expected a whole number"),
        ((*GOOD, "--think-time", "1:0"), "argument --think-time: '1:0': expected finite seconds"),
        ((*GOOD, "--slo", "ttft"), "argument --slo: --slo 'ttft': expected KEY:MS pairs"),
        ((*GOOD, "--daemon-arg", "--prefix-reuse off"), "--prefix-reuse is set by calctl up itself for every daemon"),
        ((*GOOD, "--gateway-arg=--routing=load"), "--routing is set by calctl up itself for every gateway"),
        ((*GOOD, "--daemon-arg", "--listen x"), "--listen is set by calctl up itself"),
    ],
)
def test_bad_flags_are_usage_errors(capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], message: str) -> None:
    assert message in usage_error(capsys, *argv)


def test_an_unknown_configuration_is_refused_before_anything_is_built(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code = main([*GOOD, "--dir", str(tmp_path), "--configs", "mt-x3-on-load"])
    out, err = capsys.readouterr()
    assert (code, out) == (1, "")
    assert err.startswith("calctl: invalid_argument: unknown configuration mt-x3-on-load (this comparison has: ")
    assert not (tmp_path / "models").exists()


def test_a_dir_too_long_for_unix_sockets_is_refused_before_anything_is_built(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    deep = tmp_path / ("d" * 100)
    code = main([*GOOD, "--dir", str(deep), "--boards", "1"])
    _, err = capsys.readouterr()
    assert code == 1 and "the boards' Unix sockets would be longer than 107 bytes" in err
    assert not deep.exists()


def test_a_conversation_longer_than_a_lane_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # the defaults: system 1,005, 5 user messages of 105, 4 answers of 105, the generation prompt 5, the answer 100
    code = main([*GOOD, "--dir", str(tmp_path), "--decode-batches", "4", "--list"])
    _, err = capsys.readouterr()
    assert code == 1 and "invalid_argument: the last turn needs about 2055 tokens" in err and "holds 256" in err


def test_list_shows_one_time_scale_for_every_fleet(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    argv = [*GOOD, "--dir", str(tmp_path), "--decode-batches", "4", "--boards", "1,2", "--list"]
    code = main([*argv, "--system-tokens", "32", "--user-tokens", "8", "--answer-tokens", "6", "--turns", "3"])
    out, err = capsys.readouterr()
    assert code == 0, err
    lines = [line for line in out.splitlines() if line.startswith("mt-")]
    assert [line.split(":")[0] for line in lines] == [
        "mt-x1-off-load", "mt-x1-on-load", "mt-x2-off-load", "mt-x2-on-load", "mt-x2-on-prefix"
    ]  # fmt: skip
    assert "3 users x 3 turns" in lines[0] and "6 users x 3 turns" in lines[2]  # 0.75 x 4 lanes per board
    assert len({line.split("time scale ")[1].split(",")[0] for line in lines}) == 1
    assert out.splitlines()[-1].startswith("5 runs, at least ~")
    assert not (tmp_path / "suite.json").exists() and not (tmp_path / "fleets").exists()


def test_the_canonical_command_names_every_size() -> None:
    args = build_parser().parse_args(
        [
            *GOOD,
            "--dir",
            "d",
            "--boards",
            "1,2",
            "--turns",
            "3",
            "--think-time",
            "0",
            "--daemon-arg",
            "--log-level DEBUG",
        ]
    )
    assert suite_command(args) == (
        "calctl bench suite --preset tiny --dir d --decode-batches 1,4,8,16 --time-scale auto --multiturn "
        "--boards 1,2 --users-per-lane 0.75 --turns 3 --system-tokens 1000 --user-tokens 100 --answer-tokens 100 "
        "--think-time 0 '--daemon-arg=--log-level DEBUG' --seed 0"
    )
