"""The suite's matrix: configurations, expansion into runs (names, counts, lengths scaled to the
packages' contexts, per-board concurrency), the selection flags, and each run's prompt file."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import pytest

from calculet.common.errors import InvalidArgument
from calculet.ops.bench.limit import Policy
from calculet.ops.bench.suite.matrix import (
    FleetSpec,
    Selection,
    SuiteRun,
    WorkloadSpec,
    expand,
    full_matrix,
    quick_matrix,
)
from calculet.ops.bench.suite.prompts import plan_lines, prompts_name, write_prompts
from calculet.ops.bench.workload import LengthSpec, load_jsonl

BATCHES = (1, 4, 8, 16)


def contexts(serial: int = 40_960, batched: int = 5_120) -> dict[str, int]:
    return {"serial": serial, "b1": batched, "b4": batched, "b8": batched, "b16": batched}


def context_of(table: dict[str, int]) -> Callable[[FleetSpec], int]:
    return lambda fleet: table[fleet.package_key]


def test_the_quick_matrix_runs() -> None:
    runs = expand(quick_matrix(BATCHES), context_of(contexts()), Selection())
    assert [r.name for r in runs] == [
        "serial.short.c1.gateway", "serial.short.c1.daemon", "serial.short.c16.gateway", "serial.short.c16.daemon",
        "if1-b16.short.c1.gateway", "if1-b16.short.c16.gateway",
        "if2-b16.short.c1.gateway", "if2-b16.short.c1.daemon", "if2-b16.short.c16.gateway", "if2-b16.short.c16.daemon",
        "if2-b16.mixed.c16.gateway",
        "if2-b16-x2.short.c32.gateway",
    ]  # fmt: skip
    counts = {r.name: (r.requests, r.warmup) for r in runs}
    assert counts["serial.short.c1.gateway"] == (8, 1)  # at least 8
    assert counts["serial.short.c16.gateway"] == (32, 16)  # 2 a client
    assert counts["if2-b16-x2.short.c32.gateway"] == (64, 16)  # 16 clients a board, warm-up capped
    assert counts["if2-b16.mixed.c16.gateway"] == (32, 16)
    serial = runs[0].fleet
    assert (serial.policy, serial.max_inflight, serial.decode_batch, serial.package_key) == (
        Policy.SERIAL,
        1,
        1,
        "serial",
    )
    x2 = runs[-1].fleet
    assert (x2.policy, x2.max_inflight, x2.boards, x2.package_key) == (Policy.CONTINUOUS, 2, 2, "b16")


def test_the_full_matrix_configurations() -> None:
    names = [e.fleet.name for e in full_matrix(BATCHES)]
    assert names == [
        "serial", "if1-b1", "if1-b4", "if1-b8", "if1-b16", "if2-b1", "if2-b4", "if2-b8", "if2-b16",
        "if2-b16-x2", "if2-b16-x4", "serial-len",
    ]  # fmt: skip
    runs = expand(full_matrix(BATCHES), context_of(contexts()), Selection())
    by_config = {n: [r for r in runs if r.fleet.name == n] for n in names}
    assert {r.concurrency for r in by_config["if2-b16-x4"]} == {16, 64}  # 4 and 16 a board
    assert len(by_config["serial-len"]) == 10 * 4  # prompts 1 .. 40,900 x outputs
    # docs/sources.md 001 §12.1: at least 20 measured runs per cell after 3 warm-ups.
    counts = {r.name: (r.requests, r.warmup) for r in (r for rs in by_config.values() for r in rs)}
    assert counts["serial-len.len-1x1.c1.gateway"] == (20, 3)
    assert counts["serial.short.c1.gateway"] == (20, 3)
    assert counts["serial.short.c32.gateway"] == (128, 16)  # 4 a client, one warm-up each (capped)
    assert counts["if2-b16.mixed.c4.gateway"] == (20, 4)
    assert {r.workload.name for r in by_config["if1-b4"]} == {"short", "mixed"}
    assert {r.workload.name for r in by_config["if2-b16"]} == {"short", "mixed", "long"}
    assert all(r.target == "gateway" for r in runs if r.workload.name != "short")


def test_lengths_are_scaled_to_fit_the_smallest_context_and_the_grid_to_its_own() -> None:
    runs = expand(
        full_matrix(BATCHES), context_of(contexts()), Selection(workloads=frozenset({"long", "len-40900x512"}))
    )
    long = {r.workload.long_prompt for r in runs if r.workload.name == "long"}
    assert long == {5_120 - 128}  # every configuration runs the same long prompts, serial too
    (grid,) = (r.workload for r in runs if r.workload.name == "len-40900x512")
    assert (grid.short_prompt, grid.output) == ((40_960 - 512, 40_960 - 512), 512)


def test_a_tiny_context_clips_the_output_too() -> None:
    spec = WorkloadSpec("w", (16, 128), 512, (1,), long_prompt=40_900, long_fraction=0.1)
    scaled = spec.scale_to_context(256)
    assert (scaled.output, scaled.short_prompt, scaled.long_prompt) == (255, (1, 1), 1)


def test_the_selection_narrows_and_overrides() -> None:
    pick = Selection(
        configs=frozenset({"serial", "if2-b16-x2"}), concurrency=(2,), targets=frozenset({"gateway"}), requests=5
    )
    runs = expand(quick_matrix(BATCHES), context_of(contexts()), pick)
    assert [(r.name, r.requests, r.warmup) for r in runs] == [
        ("serial.short.c2.gateway", 5, 2),
        ("if2-b16-x2.short.c4.gateway", 5, 4),  # per board: 2 clients on each of 2 boards
    ]


@pytest.mark.parametrize(
    ("pick", "message"),
    [
        (Selection(configs=frozenset({"nosuch"})), "unknown configuration nosuch (this matrix has: if1-b16, if2-b16,"),
        (Selection(workloads=frozenset({"long"})), "unknown workload long (this matrix has: mixed, short)"),
        (Selection(targets=frozenset({"http"})), "unknown target http (this matrix has: daemon, gateway)"),
        (Selection(configs=frozenset({"if1-b16"}), targets=frozenset({"daemon"})), "the selection leaves no run"),
    ],
)
def test_bad_selections_are_refused(pick: Selection, message: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        expand(quick_matrix(BATCHES), context_of(contexts()), pick)
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"short_prompt": (9, 3)}, "bad lengths or concurrency"),
        ({"concurrency": (0,)}, "bad lengths or concurrency"),
        ({"long_fraction": 0.5}, "long fraction in 0..1 needs a long prompt"),
        ({"long_fraction": 1.5, "long_prompt": 9}, "long fraction in 0..1"),
    ],
)
def test_bad_workloads_are_refused(kwargs: dict[str, object], message: str) -> None:
    base: dict[str, object] = {"name": "w", "short_prompt": (1, 4), "output": 4, "concurrency": (1,)}
    with pytest.raises(InvalidArgument, match=message.replace(".", r"\.")):
        WorkloadSpec(**{**base, **kwargs})  # type: ignore[arg-type]


def mixed_run(requests: int = 20, warmup: int = 3) -> SuiteRun:
    fleet = FleetSpec("if2-b4", Policy.CONTINUOUS, 2, 4, 1)
    workload = WorkloadSpec("mixed", (16, 64), 32, (4,), long_prompt=1000, long_fraction=0.1)
    return SuiteRun(fleet, workload, 4, "gateway", requests, warmup)


def test_a_runs_prompts_warm_up_first_then_exactly_the_long_fraction() -> None:
    lines = plan_lines(mixed_run(), seed=7)
    warm, measured = lines[:3], lines[3:]
    assert all(16 <= w.prompt <= 64 and w.output == 4 for w in warm)
    assert len(measured) == 20 and all(m.output == 32 for m in measured)
    assert sum(1 for m in measured if m.prompt == 1000) == 2  # round(0.1 x 20)
    assert all(16 <= m.prompt <= 64 for m in measured if m.prompt != 1000)
    assert plan_lines(mixed_run(), seed=7) == lines
    assert plan_lines(mixed_run(), seed=8) != lines


def test_the_prompt_file_is_what_calctl_bench_reads(tmp_path: Path) -> None:
    run = mixed_run(requests=10, warmup=2)
    lines = plan_lines(run, seed=1)
    path = write_prompts(tmp_path / prompts_name(run), lines, vocab=50, seed=1)
    assert path.name == "mixed.c4.n10.w2.jsonl"
    loaded = load_jsonl(path, LengthSpec(1, 1), random.Random(0))
    assert [(len(r.prompt_tokens or ()), r.max_tokens) for r in loaded] == [(x.prompt, x.output) for x in lines]
    assert all(0 <= t < 50 for r in loaded for t in r.prompt_tokens or ())
