"""Runs the suite: fleet after fleet, each run a `calctl bench` of its own, in-process.

For each configuration (`FleetPlan`: the fleet, its package, its runs' estimates, its time scale):
start the local fleet (`LocalFleet`), wait until the gateway is ready, then for each run write its
prompt file, build the `calctl bench` command line that measures it (the gateway's URL or the
daemons' sockets, `--prompts`, `--concurrency`, `--ignore-eos`, `--timing-package`, `--time-scale`),
run it through the injected `measure` (the bench command's own parser and code, so the recorded
command reproduces the run against the same fleet), sample the host CPU around it, and keep the
record; then stop the fleet. A fleet that cannot start, or a run whose target cannot be used,
becomes records with `error` set and the suite goes on. Records are plain JSON-able dicts
(docs/benchmarking.md, "bench suite").
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from calculet.common.errors import CalculetError
from calculet.ops.bench.runner import BenchResult
from calculet.ops.bench.suite.cpu import CpuMeter, cpu_json
from calculet.ops.bench.suite.estimate import RunEstimate
from calculet.ops.bench.suite.fleet import daemon_flags, fleet_config, job_timeout_s
from calculet.ops.bench.suite.matrix import GATEWAY, FleetSpec, SuiteRun
from calculet.ops.bench.suite.packages import SuitePackage
from calculet.ops.bench.suite.prompts import plan_lines, prompts_name, write_prompts
from calculet.ops.fleet import FleetError, LocalFleet

Measure = Callable[[list[str]], tuple[BenchResult, dict[str, Any]]]
"""(calctl argv, e.g. ["bench", "--gateway", ...]) -> the bench's result and JSON report."""
SERVER_ROLES = ("daemons", "gateway")
MIN_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class FleetPlan:
    """One configuration ready to run: its package, time scale and runs (with their estimates)."""

    fleet: FleetSpec
    package: SuitePackage
    time_scale: float
    estimates: tuple[RunEstimate, ...]


@dataclass(frozen=True)
class SuiteContext:
    """What every run shares: where the suite writes, the model alias, the seed, the measurer and
    where progress goes."""

    suite_dir: Path
    models_root: Path
    alias: str
    seed: int
    measure: Measure
    say: Callable[[str], None]
    startup_timeout_s: float = 120.0
    slo: str | None = None  # `--slo` of every run (goodput: SLO-meeting tokens per second)


def bench_argv(
    run: SuiteRun,
    fleet: LocalFleet,
    prompts: Path,
    package: SuitePackage,
    scale: float,
    ctx: SuiteContext,
    timeout: float,
) -> list[str]:
    """The `calctl bench` command line of `run` against `fleet`."""
    if run.target == GATEWAY:
        target = ["--gateway", fleet.base_url]
    else:
        target = [word for t in fleet.targets for word in ("--daemon", t)]
    return [
        "bench", *target, "--model", ctx.alias, "--prompts", str(prompts),
        "--requests", str(run.requests), "--warmup", str(run.warmup), "--concurrency", str(run.concurrency),
        "--ignore-eos", "--seed", str(ctx.seed), "--timeout", f"{timeout:g}",
        "--timing-package", str(package.path), "--time-scale", f"{scale:g}", "--no-progress",
        *(["--slo", ctx.slo] if ctx.slo else []),
    ]  # fmt: skip


def run_record(est: RunEstimate, scale: float, command: str | None) -> dict[str, Any]:
    """A run's record before it is measured (its `report` and `host_cpu` null, no error yet)."""
    run = est.run
    return {
        "name": run.name,
        "config": run.fleet.name,
        "boards": run.fleet.boards,
        "workload": run.workload.describe(),
        "concurrency": run.concurrency,
        "target": run.target,
        "requests": run.requests,
        "warmup": run.warmup,
        "time_scale": scale,
        "estimate": {"modelled_s": est.modelled_s, "wall_s": est.modelled_s * scale},
        "command": command,
        "error": None,
        "host_cpu": None,
        "report": None,
    }


def _measure_one(plan: FleetPlan, est: RunEstimate, fleet: LocalFleet, ctx: SuiteContext) -> dict[str, Any]:
    run = est.run
    lines = plan_lines(run, ctx.seed)
    prompts = write_prompts(ctx.suite_dir / "prompts" / prompts_name(run), lines, plan.package.vocab, ctx.seed)
    timeout = max(MIN_TIMEOUT_S, 2 * est.longest_request_s * plan.time_scale + MIN_TIMEOUT_S)
    argv = bench_argv(run, fleet, prompts, plan.package, plan.time_scale, ctx, timeout)
    record = run_record(est, plan.time_scale, "calctl " + shlex.join(argv))
    return measured(record, argv, fleet, ctx, warm_tokens=sum(line.output for line in lines[: run.warmup]))


def measured(
    record: dict[str, Any], argv: list[str], fleet: LocalFleet, ctx: SuiteContext, warm_tokens: int
) -> dict[str, Any]:
    """Run one `calctl bench` (`argv`) against `fleet` and fill `record` with its report, the host CPU
    the fleet and this process spent per output token (warm-up tokens included), and `error` when the
    run failed or a request did.

    Returns:
        `record`, filled in.
    """
    meter = CpuMeter(
        {"daemons": [d.pid for d in fleet.daemons], "gateway": [fleet.gateway.pid], "client": [os.getpid()]}
    )
    before = meter.sample()
    try:
        _, report = ctx.measure(argv)
    except CalculetError as err:
        record["error"] = f"{err.kind.value}: {err}"
        return record
    tokens = report["counts"]["output_tokens"] + warm_tokens
    record["host_cpu"] = cpu_json(before, meter.sample(), tokens, SERVER_ROLES)
    record["report"] = report
    if report["counts"]["failed"]:
        record["error"] = f"{report['counts']['failed']} request(s) failed; first: {report['errors'][0]}"
    return record


def run_fleet(plan: FleetPlan, ctx: SuiteContext, on_record: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """Start `plan`'s fleet, measure its runs (each record to `on_record`), stop it.

    Returns:
        The configuration's record: the fleet, its package, time scale, daemon flags, and `error`
        when it could not start (its runs are then recorded with that error).
    """
    flags = daemon_flags(plan.fleet, job_timeout_s(plan.estimates, plan.time_scale))
    config = fleet_config(
        plan.fleet, ctx.suite_dir, ctx.models_root, plan.package.name, ctx.alias, plan.time_scale, flags
    )
    described: dict[str, Any] = plan.fleet.describe() | {
        "package": plan.package.name,
        "time_scale": plan.time_scale,
        "daemon_flags": list(flags),
        "logs": str(config.workdir / "logs"),
        "error": None,
    }
    done = 0
    try:
        with LocalFleet(config) as fleet:
            f = plan.fleet
            ctx.say(f"== {f.name}: {f.boards} board(s), {plan.package.name}, time scale {plan.time_scale:g}")
            fleet.start(ctx.startup_timeout_s)
            fleet.wait_ready(ctx.startup_timeout_s)
            for est in plan.estimates:
                on_record(_measure_one(plan, est, fleet, ctx))
                done += 1
    except FleetError as err:
        described["error"] = f"the fleet failed: {err}"
        for est in plan.estimates[done:]:
            on_record(run_record(est, plan.time_scale, None) | {"error": described["error"]})
    return described


def run_suite(
    plans: Sequence[FleetPlan], ctx: SuiteContext, on_record: Callable[[dict[str, Any]], None]
) -> list[dict[str, Any]]:
    """Every fleet in order; returns the configurations' records (the runs go to `on_record`)."""
    return [run_fleet(plan, ctx, on_record) for plan in plans]
