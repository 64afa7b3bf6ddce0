"""`calctl bench suite`: the benchmark matrix of docs/sources.md 001 §12 on local calsim fleets (docs/benchmarking.md,
"bench suite").

For each configuration of the matrix (serial; continuous batching with in-flight 1 and 2 at each
decode batch; 2 and 4 boards behind one gateway) it builds or reuses the package, starts a local
fleet (`calctl up`'s `LocalFleet`) at a time scale where host CPU is not the limit, and runs each
workload (short, long, 10 % long, the length grid) at each concurrency through the gateway (and,
for the short workload of two configurations, directly against the daemons), each run a `calctl
bench` with `--timing-package`, so every figure is also related to the timing model. Writes
`<dir>/suite.json`, `<dir>/report.md` and `<dir>/plots/*.png` (with matplotlib). `--list` shows
the runs and their estimated time without running them. Exit 0 when every run succeeded, 1 when a
run or a fleet failed (the outputs are written all the same) or a package cannot be built, 2 on
bad flags.

Data flow: flags -> matrix (`suite.matrix`) -> packages (`suite.packages`) -> runs (`expand`) ->
estimates and time scales (`suite.estimate`) -> `suite.runner.run_fleet` per configuration, each run
through `bench.measure` -> `SuiteDocument` -> report and plots.

`--multiturn` runs issue 19's comparison instead (`suite.multiturn_suite`): the multi-turn workload
on 1 and 4 boards with prefix reuse off and on, load-only and prefix+cost routing, and the issue's
targets in the report. A matrix flag with it, or one of its flags without it, is a usage error.
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
from collections.abc import Callable, Sequence
from functools import cache
from pathlib import Path
from typing import Any

from calculet.common.errors import InvalidArgument
from calculet.ops.bench.runner import BenchResult
from calculet.ops.bench.suite import multiturn_flags
from calculet.ops.bench.suite.document import SuiteDocument
from calculet.ops.bench.suite.estimate import AUTO_FLOOR, CPU_SHARE, auto_time_scale, estimate
from calculet.ops.bench.suite.matrix import (
    MatrixEntry,
    Selection,
    SuiteRun,
    expand,
    full_matrix,
    quick_matrix,
)
from calculet.ops.bench.suite.multiturn_suite import run_comparison
from calculet.ops.bench.suite.packages import SuitePackage, ensure
from calculet.ops.bench.suite.runner import FleetPlan, SuiteContext, run_fleet
from calculet.ops.commands.bench import count_arg, typed_arg
from calculet.ops.commands.daemon_cmds import EXIT_OK, UsageError, problem
from calculet.ops.sim_packages import PRESETS
from calculet.ops.sim_packages.build import check_decode_batches

COMMAND = ("bench", "suite")
HELP = "Run the benchmark matrix on local calsim fleets, every figure related to the timing model."
DEFAULT_PRESET = "qwen3-30b-a3b"
DEFAULT_BATCHES = (1, 4, 8, 16)
AUTO = "auto"


def _int_list(text: str) -> tuple[int, ...]:
    """`1,4,8` -> (1, 4, 8). Raises InvalidArgument: not whole numbers >= 1."""
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise InvalidArgument(f"{text!r}: expected whole numbers separated by commas") from None
    if min(values) < 1:
        raise InvalidArgument(f"{text!r}: every value must be at least 1")
    return values


def _names(text: str) -> frozenset[str]:
    names = frozenset(n.strip() for n in text.split(",") if n.strip())
    if not names:
        raise InvalidArgument(f"{text!r}: expected names separated by commas")
    return names


def _time_scale(text: str) -> float | None:
    """`auto` (None) or a finite number > 0. Raises InvalidArgument otherwise."""
    if text == AUTO:
        return None
    try:
        value = float(text)
    except ValueError:
        raise InvalidArgument(f"{text!r}: expected auto or a number") from None
    if not math.isfinite(value) or value <= 0:
        raise InvalidArgument(f"{text!r}: must be a number > 0 (relative figures need the device to take time)")
    return value


def _batches(text: str) -> tuple[int, ...]:
    return check_decode_batches(_int_list(text))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preset", choices=sorted(PRESETS), default=DEFAULT_PRESET, help=f"({DEFAULT_PRESET})")
    parser.add_argument("--quick", action="store_true", help="a small subset: a few minutes on 2 cores")
    parser.add_argument("--dir", type=Path, default=Path("bench-suite"), help="packages, fleets, results (bench-suite)")
    batches_help = "decode batches of the continuous configurations (1,4,8,16)"
    parser.add_argument(
        "--decode-batches", type=typed_arg(_batches), default=DEFAULT_BATCHES, metavar="B,..", help=batches_help
    )
    pick = parser.add_argument_group("narrow the matrix")
    pick.add_argument("--configs", type=typed_arg(_names), metavar="NAME,..", help="configurations (see --list)")
    pick.add_argument("--workloads", type=typed_arg(_names), metavar="NAME,..", help="workloads (see --list)")
    pick.add_argument("--targets", type=typed_arg(_names), metavar="gateway,daemon", help="targets")
    pick.add_argument("--concurrency", type=typed_arg(_int_list), metavar="N,..", help="per-board concurrencies")
    pick.add_argument("--requests", type=count_arg(1), metavar="N", help="measured requests of every run")
    pick.add_argument("--list", action="store_true", help="print the runs and their estimated time; run nothing")
    scale_help = "calsim time scale of every fleet, or auto: where host CPU is not the limit (auto)"
    parser.add_argument("--time-scale", type=typed_arg(_time_scale), default=None, metavar="auto|F", help=scale_help)
    cpu_help = "host CPU per streamed token that auto assumes, daemon + gateway + client (1000)"
    parser.add_argument("--host-cpu-us-per-token", type=count_arg(1), default=1000, metavar="US", help=cpu_help)
    parser.add_argument("--seed", type=count_arg(0), default=0, help="prompts and sampling seed (0)")
    parser.add_argument("--startup-timeout", type=count_arg(1), default=120, metavar="S", help="fleet readiness (120)")
    parser.add_argument("--no-plot", action="store_true", help="no plots (they need matplotlib)")
    multiturn_flags.add_arguments(parser)


def _say(text: str) -> None:
    print(text, flush=True)


def suite_command(args: argparse.Namespace) -> str:
    """The canonical command line of these arguments (for the report)."""
    words = ["calctl", "bench", "suite", "--preset", args.preset, "--dir", str(args.dir)]
    words += ["--quick"] if args.quick else []
    words += ["--decode-batches", ",".join(map(str, args.decode_batches))]
    for flag, value in (("--configs", args.configs), ("--workloads", args.workloads), ("--targets", args.targets)):
        words += [flag, ",".join(sorted(value))] if value else []
    words += ["--concurrency", ",".join(map(str, args.concurrency))] if args.concurrency else []
    words += ["--requests", str(args.requests)] if args.requests else []
    words += ["--time-scale", AUTO if args.time_scale is None else f"{args.time_scale:g}"]
    words += _multiturn_words(args) if args.multiturn else ["--slo", args.slo] if args.slo else []
    return shlex.join([*words, "--seed", str(args.seed)])


def _multiturn_words(args: argparse.Namespace) -> list[str]:
    """The comparison's flags, defaults applied, for the canonical command line."""
    s = multiturn_flags.sizes_from(args)
    think = f"{s.think.low:g}" if s.think.low == s.think.high else f"{s.think.low:g}:{s.think.high:g}"
    words = ["--multiturn", "--boards", ",".join(map(str, args.boards or multiturn_flags.DEFAULT_BOARDS))]
    words += ["--users-per-lane", f"{s.users_per_lane:g}", "--turns", str(s.turns)]
    words += ["--system-tokens", str(s.system_tokens), "--user-tokens", str(s.user_tokens)]
    words += ["--answer-tokens", str(s.answer_tokens), "--think-time", think]
    words += ["--slo", args.slo] if args.slo else []
    for flag, values in (("--daemon-arg", args.daemon_arg), ("--gateway-arg", args.gateway_arg)):
        words += [f"{flag}={shlex.join(v)}" for v in values or ()]
    return words


def _check_mode_flags(args: argparse.Namespace) -> None:
    """Raises: UsageError: matrix flags with --multiturn, or multi-turn flags without it."""
    if args.multiturn:
        theirs = multiturn_flags.foreign(args)
        if theirs:
            raise UsageError(f"{', '.join(theirs)}: not with --multiturn (it runs its own fleets and workload)")
    else:
        mine = multiturn_flags.given(args)
        if mine:
            raise UsageError(f"{', '.join(mine)}: only with --multiturn")


def _packages(entries: Sequence[MatrixEntry], args: argparse.Namespace, models_root: Path) -> dict[str, SuitePackage]:
    """Every package the matrix names, built once. Raises CalculetError: a build failed."""
    lanes = max(args.decode_batches)
    keys = dict.fromkeys(e.fleet.package_key for e in entries)
    return {key: ensure(models_root, args.preset, key, lanes, _say) for key in keys}


def _plans(runs: Sequence[SuiteRun], packages: dict[str, SuitePackage], args: argparse.Namespace) -> list[FleetPlan]:
    """Runs grouped by configuration, in order, with their estimates and the fleet's time scale."""
    grouped: dict[str, list[SuiteRun]] = {}
    for run in runs:
        grouped.setdefault(run.fleet.name, []).append(run)
    plans = []
    for group in grouped.values():
        fleet = group[0].fleet
        package = packages[fleet.package_key]
        estimates = tuple(estimate(r, package.model, args.seed) for r in group)
        scale = args.time_scale or auto_time_scale(
            estimates, args.host_cpu_us_per_token / 1e6, os.cpu_count() or 1, fleet.scale_floor
        )
        plans.append(FleetPlan(fleet, package, scale, estimates))
    return plans


def _scale_rule(args: argparse.Namespace) -> str:
    if args.time_scale is not None:
        return f"--time-scale {args.time_scale:g} for every fleet."
    return (
        f"auto: per fleet, the smallest multiple of 0.05 >= {AUTO_FLOOR:g} (the length grid's fleet: its own floor) "
        f"at which its peak timing-model throughput x {args.host_cpu_us_per_token} us of host CPU per token "
        f"stays under {CPU_SHARE:.0%} of the {os.cpu_count()} cores."
    )


def _list(plans: Sequence[FleetPlan]) -> None:
    total = 0.0
    for plan in plans:
        _say(f"{plan.fleet.name}: {plan.package.name}, {plan.fleet.boards} board(s), time scale {plan.time_scale:g}")
        for e in plan.estimates:
            wall = e.modelled_s * plan.time_scale
            total += wall
            _say(f"  {e.run.name}: {e.run.requests} requests, >= {e.modelled_s:.1f} modelled s, ~{wall:.1f} wall s")
    runs = sum(len(p.estimates) for p in plans)
    _say(f"{runs} runs, at least ~{total / 60:.1f} wall minutes ({total:.0f} s; fleet starts aside)")


def _progress(record: dict[str, Any]) -> str:
    """One line per finished run."""
    if record["report"] is None:
        return f"  {record['name']}: {record['error']}"
    tm = record["report"].get("timing_model") or {}
    rel = tm.get("relative") or {}
    tput = record["report"]["throughput"]["output_tokens_per_s"] or 0.0
    ratio = rel.get("throughput")
    tpot = (rel.get("tpot") or {}).get("p50")
    parts = [f"{tput:.1f} tok/s", f"{ratio:.3f} of the limit" if ratio is not None else "limit n/a"]
    parts += [f"TPOT p50 {tpot:.2f} x step" if tpot is not None else "no TPOT"]
    cpu = record["host_cpu"] or {}
    parts += [f"host busy {100 * (cpu.get('host_busy') or 0):.0f} %"]
    return f"  {record['name']}: " + ", ".join(parts) + (f"; {record['error']}" if record["error"] else "")


@cache
def _parser() -> argparse.ArgumentParser:
    from calculet.ops import calctl  # here: calctl imports every command module, this one too

    return calctl.build_parser()


def measure(argv: list[str]) -> tuple[BenchResult, dict[str, Any]]:
    """One `calctl bench` run, parsed by calctl's own parser, measured in-process."""
    from calculet.ops.commands import bench  # here: the command module, not a library

    return bench.measure(_parser().parse_args(argv))


def _matrix(args: argparse.Namespace) -> tuple[MatrixEntry, ...]:
    return quick_matrix(args.decode_batches) if args.quick else full_matrix(args.decode_batches)


def run(
    args: argparse.Namespace, measure_fn: Callable[[list[str]], tuple[BenchResult, dict[str, Any]]] = measure
) -> int:
    _check_mode_flags(args)
    if args.multiturn:
        failed = run_comparison(args, suite_command(args), measure_fn, _say)
        if failed:
            return problem(f"bench suite: {len(failed)} failed: {', '.join(failed[:5])}")
        return EXIT_OK
    selection = Selection(args.configs, args.workloads, args.concurrency, args.targets, args.requests)
    entries = _matrix(args)
    selection.check(entries)
    suite_dir = args.dir.resolve()
    models_root = suite_dir / "models"
    packages = _packages(entries, args, models_root)
    runs = expand(entries, lambda fleet: packages[fleet.package_key].model.context, selection)
    plans = _plans(runs, packages, args)
    if args.list:
        _list(plans)
        return EXIT_OK
    header = {
        "command": suite_command(args),
        "preset": args.preset,
        "mode": "quick" if args.quick else "full",
        "seed": args.seed,
        "host": {"cpus": os.cpu_count(), "host_cpu_us_per_token": args.host_cpu_us_per_token},
        "time_scale_rule": _scale_rule(args),
    }
    doc = SuiteDocument(suite_dir, header)
    ctx = SuiteContext(
        suite_dir, models_root, args.preset, args.seed, measure_fn, _say, float(args.startup_timeout), args.slo
    )

    on_record = doc.recorder(_say, _progress)
    for plan in plans:
        doc.add_config(run_fleet(plan, ctx, on_record))
    doc.finish(_say, plots=not args.no_plot)
    if doc.failed:
        return problem(f"bench suite: {len(doc.failed)} failed: {', '.join(doc.failed[:5])}")
    return EXIT_OK
