"""`calctl soak --duration 30m --out DIR`: stability measured in hours (docs/reliability.md).

Owns the command's flags and its output around `calculet.ops.soak.run.SoakRun`: a local fleet of
`--boards` calsim boards serving `--preset` (or the first of `--models A,B`) under `--policy`, with
fault injection, behind the gateway, plus a clean one-board reference fleet for the oracle;
open-loop traffic at `--load` of capacity through the `openai` client; a fault cycle (device
faults, a submit-error streak, a hang, a lost device, SIGKILL, a rollout, and with `--models` a
model switch) with the harness restarting and resuming boards; every request checked against the
reference; windows, drift and process growth; `DIR/soak.json` and `DIR/soak.png`. `--duration` is
board time: at `--time-scale 0.1` a board-day takes 2.4 hours (docs/reliability.md, "Board time").

Exit status: 0 PASS, 1 FAIL (the reasons on stderr; also when a fleet could not start or the
references could not be computed), 2 usage.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from calculet.common.errors import CalculetError
from calculet.ops.commands.up import board_count, preset_list, time_scale
from calculet.ops.fleet import FleetError
from calculet.ops.sim_packages import PRESETS
from calculet.ops.soak.durations import parse_duration
from calculet.ops.soak.run import SoakRun
from calculet.ops.soak.settings import POLICIES, SoakSettings

COMMAND = ("soak",)
HELP = "Soak a local calsim fleet for hours under faults, checking every answer against a clean reference."
EXIT_PASS, EXIT_FAIL = 0, 1
MIN_POOL = 10
DEFAULT_PRESET = "qwen3-30b-a3b"


def duration(text: str) -> float:
    """argparse type: `90s`, `2m`, `30m`, `2h`. Raises argparse.ArgumentTypeError otherwise."""
    try:
        return parse_duration(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def load_fraction(text: str) -> float:
    """argparse type: a fraction of capacity in (0, 4]. Raises argparse.ArgumentTypeError otherwise."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number such as 0.7") from None
    if not (math.isfinite(value) and 0 < value <= 4):
        raise argparse.ArgumentTypeError(f"{text}: must be more than 0 and at most 4")
    return value


def positive_int(minimum: int) -> Callable[[str], int]:
    """argparse type: an integer >= `minimum`."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: expected an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value}: must be at least {minimum}")
        return value

    return parse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--duration", type=duration, required=True, metavar="D", help="soak phase in board time: 90s, 2m, 30m, 2h, 24h"
    )
    parser.add_argument("--out", type=Path, required=True, metavar="DIR", help="soak.json, soak.png, fleets, logs")
    models = parser.add_mutually_exclusive_group()
    models.add_argument("--preset", choices=sorted(PRESETS), help="package the boards serve (qwen3-30b-a3b)")
    models.add_argument(
        "--models",
        type=soak_models,
        metavar="A,B",
        help="two presets: the boards serve A, the gateway's catalog holds B, the faults switch a board to B",
    )
    parser.add_argument("--policy", choices=POLICIES, default="continuous", help="the daemons' scheduling (continuous)")
    parser.add_argument(
        "--time-scale", type=time_scale, default=1.0, metavar="S", help="the soak boards' calsim time scale (1)"
    )
    parser.add_argument("--boards", type=board_count, default=2, metavar="N", help="boards of the soak fleet (2)")
    parser.add_argument("--load", type=load_fraction, default=0.7, metavar="F", help="arrivals x capacity (0.7)")
    parser.add_argument("--seed", type=positive_int(0), default=0, metavar="N", help="pool, arrivals, picks (0)")
    parser.add_argument("--faults", choices=("on", "off"), default="on", help="play the fault cycle (on)")
    parser.add_argument(
        "--pool", type=positive_int(MIN_POOL), default=200, metavar="N", help="requests in the pool (200)"
    )
    parser.add_argument(
        "--sample-interval", type=duration, default=5.0, metavar="D", help="process usage sampling period (5s)"
    )
    parser.add_argument(
        "--calibration",
        type=duration,
        metavar="D",
        help="the capacity calibration's closed loop, wall time (5%% of the run in board time, 15-120 s)",
    )
    parser.add_argument(
        "--lost-timeout", type=duration, default=300.0, metavar="D", help="no complete answer by then: lost (300s)"
    )
    parser.add_argument(
        "--models-root", type=Path, metavar="DIR", help="where the packages are built and kept (DIR/models)"
    )


def soak_models(text: str) -> tuple[str, str]:
    """argparse type: two distinct presets, `A,B`. Raises argparse.ArgumentTypeError otherwise."""
    names = preset_list(text)
    if len(names) != 2:
        raise argparse.ArgumentTypeError(f"{text!r}: expected two presets, A,B")
    return names[0], names[1]


def settings_from(args: argparse.Namespace) -> SoakSettings:
    preset, switch = args.models if args.models else (args.preset or DEFAULT_PRESET, None)
    return SoakSettings(
        duration_s=args.duration,
        out=args.out,
        preset=preset,
        switch_model=switch,
        policy=args.policy,
        time_scale=args.time_scale,
        boards=args.boards,
        load=args.load,
        seed=args.seed,
        faults=args.faults == "on",
        pool_size=args.pool,
        sample_interval_s=args.sample_interval,
        lost_timeout_s=args.lost_timeout,
        models_root=args.models_root,
        calibration_s=args.calibration,
    )


def _say(text: str) -> None:
    print(text, flush=True)


def _comparison(label: str, c: dict[str, Any]) -> str:
    change = "n/a" if c["change"] is None else f"{c['change']:+.1%}"
    return f"{label} {c['earlier_ms']} -> {c['later_ms']} ms ({change})"


def run(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    try:
        outcome = asyncio.run(SoakRun(settings, _say).run())
    except (FleetError, CalculetError) as err:
        print(f"calctl soak: {err}", file=sys.stderr, flush=True)
        return EXIT_FAIL
    report, verdict = outcome.report, outcome.verdict
    soak = report["requests"]["soak"]
    _say(f"soak: requests {soak['total']}: " + ", ".join(f"{k} {v}" for k, v in soak["by_class"].items()))
    labels = (("level", "level (judged)"), ("trend", "trend (judged)"), ("requests", "raw per-span p99"))
    for figure in report["drift"]:
        _say(f"soak: p99 {figure['metric']} " + ", ".join(_comparison(label, figure[k]) for k, label in labels))
    for process in report["processes"]:
        rss = process["metrics"].get("rss_bytes", {})
        if rss.get("late_slope_per_hour") is not None:
            judged = "judged" if rss["late_judged"] else "not judged"
            _say(
                f"soak: {process['name']} (pid {process['pid']}) RSS after the first board-hour "
                f"{rss['late_slope_per_hour'] / 1e6:+.2f} MB per board-hour ({judged}, bound +1 MB)"
            )
    _say(f"soak: faults {report['fault_counts']}; restarts {len(report['restarts'])}")
    for note in verdict.notes:
        _say(f"soak: note: {note}")
    _say(f"soak: report {outcome.json_path}" + (f", plot {outcome.plot_path}" if outcome.plot_path else ""))
    if verdict.passed:
        _say("soak: PASS")
        return EXIT_PASS
    for reason in verdict.reasons:
        print(f"calctl soak: FAIL: {reason}", file=sys.stderr, flush=True)
    return EXIT_FAIL
