"""Runs one fleet of the multi-turn comparison: start it, measure the workload once, stop it.

For a `ComparisonPlan` (the fleet, the package, the time scale, the estimate, the sizes, extra
flags) it starts a `LocalFleet` whose daemons get the suite's flags (`suite.fleet.daemon_flags`:
in-flight 2, long admission timeout, a job timeout above the longest modelled job) plus
`--prefix-reuse on|off` and the `--daemon-arg`s, and whose gateway gets `--routing load|prefix` and
the `--gateway-arg`s; waits until the gateway is ready; runs `calctl bench --workload multiturn`
through the injected `measure` (the bench command's own parser and code, so the recorded command
reproduces the run against the same fleet) with `--timing-package` and `--time-scale`; samples the
host CPU around it; stops the fleet. A fleet that cannot start (for instance a daemon that does not
know `--prefix-reuse` yet) or a run whose target cannot be used becomes a record with `error`,
and the suite goes on. Records are plain JSON-able dicts, like the matrix's (suite/runner.py).
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from calculet.ops.bench.suite.fleet import JOB_TIMEOUT_MARGIN, MIN_JOB_TIMEOUT_S, daemon_flags, fleet_config
from calculet.ops.bench.suite.matrix import GATEWAY, MAX_WARMUP
from calculet.ops.bench.suite.multiturn import WORKLOAD, ComparisonFleet, MultiturnSizes
from calculet.ops.bench.suite.multiturn_estimate import ComparisonEstimate
from calculet.ops.bench.suite.packages import SuitePackage
from calculet.ops.bench.suite.runner import MIN_TIMEOUT_S, SuiteContext, measured
from calculet.ops.fleet import FleetError, LocalFleet


@dataclass(frozen=True)
class ComparisonPlan:
    """One fleet of the comparison, ready to run."""

    fleet: ComparisonFleet
    package: SuitePackage
    time_scale: float
    estimate: ComparisonEstimate
    sizes: MultiturnSizes
    daemon_args: tuple[str, ...] = ()
    gateway_args: tuple[str, ...] = ()
    slo: str | None = None

    @property
    def users(self) -> int:
        return self.estimate.users

    @property
    def warmup(self) -> int:
        return min(self.users, MAX_WARMUP)

    @property
    def run_name(self) -> str:
        return f"{self.fleet.name}.{WORKLOAD}.u{self.users}.{GATEWAY}"

    def job_timeout_s(self) -> float:
        return MIN_JOB_TIMEOUT_S + JOB_TIMEOUT_MARGIN * self.estimate.longest_job_s * self.time_scale

    def daemon_flags(self) -> tuple[str, ...]:
        spec = self.fleet.spec(self.package.model.max_batch)
        return (*daemon_flags(spec, self.job_timeout_s()), *self.fleet.daemon_flags(), *self.daemon_args)

    def gateway_flags(self) -> tuple[str, ...]:
        return (*self.fleet.gateway_flags(), *self.gateway_args)


def bench_argv(plan: ComparisonPlan, base_url: str, ctx: SuiteContext) -> list[str]:
    """The `calctl bench` command line of `plan`'s run against the gateway at `base_url`."""
    s = plan.sizes
    think = f"{s.think.low:g}" if s.think.low == s.think.high else f"{s.think.low:g}:{s.think.high:g}"
    timeout = max(MIN_TIMEOUT_S, 2 * plan.estimate.longest_job_s * plan.time_scale + MIN_TIMEOUT_S)
    return [
        "bench", "--gateway", base_url, "--model", ctx.alias, "--workload", WORKLOAD,
        "--users", str(plan.users), "--turns", str(s.turns), "--system-tokens", str(s.system_tokens),
        "--user-tokens", str(s.user_tokens), "--answer-tokens", str(s.answer_tokens), "--think-time", think,
        "--warmup", str(plan.warmup), "--seed", str(ctx.seed), "--timeout", f"{timeout:g}",
        "--timing-package", str(plan.package.path), "--time-scale", f"{plan.time_scale:g}", "--no-progress",
        *(["--slo", plan.slo] if plan.slo else []),
    ]  # fmt: skip


def run_record(plan: ComparisonPlan, command: str | None) -> dict[str, Any]:
    """The run's record before it is measured (`report` and `host_cpu` null, no error yet)."""
    f = plan.fleet
    return {
        "name": plan.run_name,
        "config": f.name,
        "boards": f.boards,
        "prefix_reuse": f.reuse,
        "routing": f.routing,
        "workload": plan.sizes.describe() | {"users": plan.users},
        "concurrency": plan.users,
        "target": GATEWAY,
        "requests": plan.users * plan.sizes.turns,
        "warmup": plan.warmup,
        "time_scale": plan.time_scale,
        "estimate": {"modelled_s": plan.estimate.modelled_s, "wall_s": plan.estimate.wall_s(plan.time_scale)},
        "command": command,
        "error": None,
        "host_cpu": None,
        "report": None,
    }


def _measure(plan: ComparisonPlan, fleet: LocalFleet, ctx: SuiteContext) -> dict[str, Any]:
    argv = bench_argv(plan, fleet.base_url, ctx)
    record = run_record(plan, "calctl " + shlex.join(argv))
    return measured(record, argv, fleet, ctx, warm_tokens=plan.warmup * plan.sizes.answer_tokens)


def run_comparison_fleet(
    plan: ComparisonPlan, ctx: SuiteContext, on_record: Callable[[dict[str, Any]], None]
) -> dict[str, Any]:
    """Start `plan`'s fleet, measure its run (its record to `on_record`), stop it.

    Returns:
        The configuration's record: the fleet, its package, time scale, daemon and gateway flags, and
        `error` when it could not start (its run is then recorded with that error).
    """
    spec = plan.fleet.spec(plan.package.model.max_batch)
    daemon = plan.daemon_flags()
    config = fleet_config(spec, ctx.suite_dir, ctx.models_root, plan.package.name, ctx.alias, plan.time_scale, daemon)
    config = replace(config, gateway_args=plan.gateway_flags())
    described: dict[str, Any] = plan.fleet.describe() | {
        "package": plan.package.name,
        "time_scale": plan.time_scale,
        "users": plan.users,
        "daemon_flags": list(daemon),
        "gateway_flags": list(plan.gateway_flags()),
        "logs": str(config.workdir / "logs"),
        "error": None,
    }
    measured = False
    try:
        with LocalFleet(config) as fleet:
            f = plan.fleet
            ctx.say(f"== {f.name}: {f.boards} board(s), {plan.users} users, time scale {plan.time_scale:g}")
            fleet.start(ctx.startup_timeout_s)
            fleet.wait_ready(ctx.startup_timeout_s)
            on_record(_measure(plan, fleet, ctx))
            measured = True
    except FleetError as err:
        described["error"] = f"the fleet failed: {err}"
        if not measured:
            on_record(run_record(plan, None) | {"error": described["error"]})
    return described
