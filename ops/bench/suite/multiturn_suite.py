"""`calctl bench suite --multiturn`: the multi-turn comparison of issue 19, end to end.

Data flow: flags (`multiturn_flags`) -> the comparison's fleets (`multiturn.comparison_fleets`,
narrowed by `--configs`) -> the suite's largest-batch package (`packages.ensure`, `b<largest
--decode-batches>` with that many lanes; the conversation must fit a lane) -> users per fleet
(`MultiturnSizes.users_for`) -> estimates (`multiturn_estimate`) -> ONE time scale for every fleet
(`--time-scale F`, or the largest of the fleets' automatic ones, so throughputs compare directly)
-> plans -> `--list`, or each fleet run by `multiturn_runner.run_comparison_fleet` -> the suite
document (mode `multiturn`) -> report.md with issue 19's targets, suite.json, plots/multiturn.png.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Sequence
from typing import Any

from calculet.common.errors import InvalidArgument
from calculet.ops.bench.suite.document import MULTITURN, SuiteDocument
from calculet.ops.bench.suite.estimate import AUTO_FLOOR, CPU_SHARE, time_scale_for_peak
from calculet.ops.bench.suite.multiturn import comparison_fleets, select
from calculet.ops.bench.suite.multiturn_estimate import estimate
from calculet.ops.bench.suite.multiturn_flags import DEFAULT_BOARDS, extra, sizes_from
from calculet.ops.bench.suite.multiturn_runner import ComparisonPlan, run_comparison_fleet
from calculet.ops.bench.suite.packages import ensure
from calculet.ops.bench.suite.runner import Measure, SuiteContext

Say = Callable[[str], None]
MAX_SOCKET_PATH = 107  # sockaddr_un.sun_path holds 108 bytes with the terminating NUL


def plans(args: argparse.Namespace, say: Say) -> list[ComparisonPlan]:
    """The comparison's fleets ready to run (the package built if needed).

    Raises:
        InvalidArgument: an unknown configuration or a `--dir` too long for the boards' Unix sockets
            (before anything is built), or a conversation that does not fit a lane; CalculetError:
            the package cannot be built.
    """
    sizes = sizes_from(args)
    fleets = select(comparison_fleets(args.boards or DEFAULT_BOARDS), args.configs)
    for fleet in fleets:
        socket = args.dir.resolve() / "fleets" / fleet.name / f"board{fleet.boards - 1}.sock"
        if len(str(socket).encode()) > MAX_SOCKET_PATH:
            raise InvalidArgument(
                f"--dir {args.dir}: the boards' Unix sockets would be longer than {MAX_SOCKET_PATH} bytes "
                f"({socket}); choose a shorter --dir"
            )
    batch = max(args.decode_batches)
    package = ensure(args.dir.resolve() / "models", args.preset, f"b{batch}", batch, say)
    sizes.check_fits(package.model.context)
    estimates = [estimate(f, sizes, package.model, sizes.users_for(package.model.lanes, f.boards)) for f in fleets]
    host_s = args.host_cpu_us_per_token / 1e6
    cpus = os.cpu_count() or 1
    scale = args.time_scale or max(time_scale_for_peak(e.fleet_tokens_per_s, host_s, cpus) for e in estimates)
    daemon, gateway = extra(args.daemon_arg), extra(args.gateway_arg)
    return [ComparisonPlan(e.fleet, package, scale, e, sizes, daemon, gateway, args.slo) for e in estimates]


def scale_rule(args: argparse.Namespace) -> str:
    if args.time_scale is not None:
        return f"--time-scale {args.time_scale:g} for every fleet."
    return (
        f"auto, one value for every fleet (so throughputs compare directly): the largest of the fleets' smallest "
        f"multiples of 0.05 >= {AUTO_FLOOR:g} at which the fleet's modelled peak output rate x "
        f"{args.host_cpu_us_per_token} us of host CPU per token stays under {CPU_SHARE:.0%} of the "
        f"{os.cpu_count()} cores."
    )


def list_plans(comparison: Sequence[ComparisonPlan], say: Say) -> None:
    total = 0.0
    for p in comparison:
        wall = p.estimate.wall_s(p.time_scale)
        total += wall
        say(
            f"{p.fleet.name}: {p.package.name}, {p.fleet.boards} board(s), {p.users} users x {p.sizes.turns} turns, "
            f"time scale {p.time_scale:g}, >= {p.estimate.modelled_s:.1f} modelled s, ~{wall:.1f} wall s"
        )
    say(f"{len(comparison)} runs, at least ~{total / 60:.1f} wall minutes ({total:.0f} s; fleet starts aside)")


def progress_line(record: dict[str, Any]) -> str:
    """One line per finished run."""
    report = record["report"]
    if report is None:
        return f"  {record['name']}: {record['error']}"
    mt = report["multiturn"]
    tput = report["throughput"]["output_tokens_per_s"] or 0.0
    later = mt["cached_share_later"]
    parts = [f"{tput:.1f} tok/s", "from cache (t>=2) " + (f"{100 * later:.1f} %" if later is not None else "n/a")]
    ttft = mt["later_turns"]["ttft_p50_ms"]
    parts.append(f"TTFT p50 (t>=2) {ttft:.1f} ms" if ttft is not None else "no TTFT")
    return f"  {record['name']}: " + ", ".join(parts) + (f"; {record['error']}" if record["error"] else "")


def run_comparison(args: argparse.Namespace, command: str, measure: Measure, say: Say) -> list[str]:
    """Run (or `--list`) the comparison; returns the names of the runs and fleets that failed.

    Raises:
        InvalidArgument, CalculetError: as `plans`; OSError: the outputs cannot be written.
    """
    comparison = plans(args, say)
    if args.list:
        list_plans(comparison, say)
        return []
    suite_dir = args.dir.resolve()
    header = {
        "command": command,
        "preset": args.preset,
        "mode": MULTITURN,
        "seed": args.seed,
        "host": {"cpus": os.cpu_count(), "host_cpu_us_per_token": args.host_cpu_us_per_token},
        "time_scale_rule": scale_rule(args),
        "multiturn": comparison[0].sizes.describe(),
    }
    doc = SuiteDocument(suite_dir, header)
    timeout = float(args.startup_timeout)
    ctx = SuiteContext(suite_dir, suite_dir / "models", args.preset, args.seed, measure, say, timeout)

    on_record = doc.recorder(say, progress_line)
    for plan in comparison:
        doc.add_config(run_comparison_fleet(plan, ctx, on_record))
    doc.finish(say, plots=not args.no_plot)
    for t in doc.doc["targets"]:
        verdict = {True: "met", False: "MISSED", None: "not checked"}[t["met"]]
        say(f"target {t['name']} ({t['runs']}): {verdict}")
    return doc.failed
