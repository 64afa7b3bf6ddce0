"""`calctl bench compare PKG_A PKG_B`: the A/B of docs/sources.md 000 §11 (M6, "chosen by
measurement"): the same workload on each package, one local calsim fleet after the other, side by
side in one report, the verdict by goodput (docs/benchmarking.md, "bench compare").

Data flow: flags -> both packages validated (`validate_package`) and read (`DeviceModel`, vocab) ->
one `SuiteRun` (short prompts uniform in `--prompt-tokens`, `--output-tokens` each, closed loop at
`--concurrency`, through the gateway), scaled to the smaller context of the two -> its estimate on
each package -> ONE time scale for both (`--time-scale`, or the larger of their automatic ones) ->
for each package, `suite.runner.run_fleet` (a one-board `LocalFleet` serving it, the run measured
by `calctl bench` in-process, `--timing-package` and `--slo` included) -> `compare.compare_json` ->
`<dir>/compare.json`, `<dir>/compare.md`, the table on stdout; each side's whole run record (its
`calctl bench` report inside) in `<dir>/A.json` and `<dir>/B.json`. The SLO is given in BOARD
milliseconds and passed to the bench multiplied by the time scale (wall milliseconds), so the
verdict does not move with the time scale. Exit 0 with a verdict or a tie, 1 when a run failed or
a package is invalid, 2 on bad flags.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from calculet.common.errors import CalculetError, FailedPrecondition, InvalidArgument
from calculet.daemon.package.manifest import PackageManifest, load_manifest
from calculet.daemon.package.validate import validate_package
from calculet.ops.bench.compare import DEFAULT_MARGIN, compare_json, markdown, render, side_json
from calculet.ops.bench.device_model import DeviceModel
from calculet.ops.bench.limit import Policy
from calculet.ops.bench.runner import BenchResult
from calculet.ops.bench.suite.estimate import auto_time_scale, estimate
from calculet.ops.bench.suite.matrix import GATEWAY, FleetSpec, SuiteRun, WorkloadSpec
from calculet.ops.bench.suite.packages import SuitePackage
from calculet.ops.bench.suite.runner import FleetPlan, SuiteContext, run_fleet
from calculet.ops.commands.bench import count_arg, typed_arg
from calculet.ops.commands.bench_suite import measure
from calculet.ops.commands.daemon_cmds import EXIT_OK, console, problem
from calculet.ops.commands.package_validate import existing_dir

COMMAND = ("bench", "compare")
HELP = "A/B: the same workload on two packages, one local fleet each, side by side; the verdict by goodput."
DEFAULT_SLO = "ttft:3000,tpot:100"  # board milliseconds: a 256-token prefill and a batch-16 step fit
ALIAS = "model"
Measure = Callable[[list[str]], tuple[BenchResult, dict[str, Any]]]


def _pair(text: str) -> tuple[int, int]:
    """`16,64` -> (16, 64). Raises InvalidArgument unless 1 <= LO <= HI."""
    try:
        lo, hi = (int(v) for v in text.split(","))
    except ValueError:
        raise InvalidArgument(f"{text!r}: expected LO,HI (whole numbers)") from None
    if not 1 <= lo <= hi:
        raise InvalidArgument(f"{text!r}: need 1 <= LO <= HI")
    return lo, hi


def _slo_scaled(slo: str, scale: float) -> str:
    """`ttft:3000,tpot:100` at time scale 0.5 -> `ttft:1500,tpot:50` (board ms -> wall ms).

    Raises:
        InvalidArgument: not NAME:MS pairs with MS > 0.
    """
    out = []
    for part in slo.split(","):
        name, _, ms = part.partition(":")
        try:
            value = float(ms)
        except ValueError:
            raise InvalidArgument(f"--slo {slo!r}: {part!r} is not NAME:MS") from None
        if not value > 0:
            raise InvalidArgument(f"--slo {slo!r}: {part!r} must be above 0 ms")
        out.append(f"{name.strip()}:{value * scale:g}")
    return ",".join(out)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("package_a", type=existing_dir, metavar="PKG_A", help="the first package directory")
    parser.add_argument("package_b", type=existing_dir, metavar="PKG_B", help="the second package directory")
    parser.add_argument("--dir", type=Path, default=Path("bench-compare"), help="fleets and results (bench-compare)")
    parser.add_argument("--concurrency", type=count_arg(1), default=4, metavar="N", help="clients (4)")
    parser.add_argument("--requests", type=count_arg(1), default=16, metavar="N", help="measured requests (16)")
    parser.add_argument("--warmup", type=count_arg(0), default=2, metavar="N", help="warm-up requests (2)")
    parser.add_argument("--prompt-tokens", type=typed_arg(_pair), default=(16, 64), metavar="LO,HI",
                        help="prompt lengths, uniform (16,64)")  # fmt: skip
    parser.add_argument("--output-tokens", type=count_arg(1), default=32, metavar="N", help="tokens each (32)")
    parser.add_argument("--policy", choices=[p.value for p in Policy], default=Policy.CONTINUOUS.value,
                        help="the daemons' policy (continuous)")  # fmt: skip
    parser.add_argument("--max-inflight", type=count_arg(1), default=2, metavar="N", help="device jobs in flight (2)")
    parser.add_argument("--slo", default=DEFAULT_SLO, metavar="ttft:MS,tpot:MS,e2e:MS",
                        help=f"goodput's SLO in BOARD ms, scaled by the time scale ({DEFAULT_SLO})")  # fmt: skip
    parser.add_argument("--margin", type=float, default=DEFAULT_MARGIN, metavar="F",
                        help=f"the goodput lead that decides; below it the runs tie ({DEFAULT_MARGIN})")  # fmt: skip
    parser.add_argument("--time-scale", type=float, default=None, metavar="F",
                        help="calsim time scale of both fleets (default: the larger automatic one)")  # fmt: skip
    parser.add_argument("--seed", type=count_arg(0), default=0, help="prompts and sampling seed (0)")
    parser.add_argument("--startup-timeout", type=count_arg(1), default=120, metavar="S", help="fleet readiness (120)")


def _package(path: Path) -> tuple[SuitePackage, PackageManifest]:
    """Raises: FailedPrecondition: the package does not validate."""
    report = validate_package(path)
    if not report.ok:
        raise FailedPrecondition(f"package {path} is invalid:\n{report.render_text()}")
    manifest = load_manifest(path)
    resolved = path.resolve()
    package = SuitePackage(
        resolved.name, resolved, DeviceModel.from_manifest(manifest), manifest.architecture.vocab_size
    )
    return package, manifest


def _run(args: argparse.Namespace, spec: FleetSpec, context: int) -> SuiteRun:
    """The one run both sides make, its lengths fitted to `context` (the smaller package's)."""
    lo, hi = args.prompt_tokens
    workload = WorkloadSpec("compare", (lo, hi), args.output_tokens, (args.concurrency,), min_requests=args.requests)
    return SuiteRun(spec, workload.scale_to_context(context), args.concurrency, GATEWAY, args.requests, args.warmup)


def compare(
    args: argparse.Namespace, measure_fn: Measure = measure, say: Callable[[str], None] = print
) -> dict[str, Any]:
    """Run both sides and build the comparison document (module docstring).

    Raises:
        CalculetError: a package is invalid; InvalidArgument: a bad --slo or --time-scale.
    """
    sides = [("A", Path(args.package_a)), ("B", Path(args.package_b))]
    loaded = [(label, *_package(path)) for label, path in sides]
    context = min(p.model.context for _, p, _ in loaded)
    batch = {label: max(p.model.decode_batches) for label, p, _ in loaded}
    policy = Policy(args.policy)
    specs = {
        label: FleetSpec(f"{label}-{p.name}", policy, args.max_inflight, batch[label], 1) for label, p, _ in loaded
    }
    estimates = {label: estimate(_run(args, specs[label], context), p.model, args.seed) for label, p, _ in loaded}
    if args.time_scale is not None and not args.time_scale > 0:
        raise InvalidArgument(f"--time-scale {args.time_scale}: must be above 0")
    scale = args.time_scale or max(
        auto_time_scale([e], 1e-3, os.cpu_count() or 1) for e in estimates.values()
    )  # one scale for both: the A/B differs in the package only
    slo = _slo_scaled(args.slo, scale)
    suite_dir = Path(args.dir).resolve()
    out: list[dict[str, Any]] = []
    for label, package, manifest in loaded:
        ctx = SuiteContext(suite_dir, package.path.parent, ALIAS, args.seed, measure_fn, say,
                           float(args.startup_timeout), slo)  # fmt: skip
        plan = FleetPlan(specs[label], package, scale, (estimates[label],))
        records: list[dict[str, Any]] = []
        say(f"== {label}: {package.name} ({manifest.topology.parallelism}), time scale {scale:g}")
        fleet = run_fleet(plan, ctx, records.append)
        record = records[0] if records else {"error": fleet["error"]}
        record = {**record, "error": record.get("error") or fleet["error"], "package_path": str(package.path)}
        suite_dir.mkdir(parents=True, exist_ok=True)
        (suite_dir / f"{label}.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        out.append(side_json(label, manifest, record))
    workload = estimates["A"].run.workload
    header = {
        "workload": f"prompts {workload.short_prompt[0]}-{workload.short_prompt[1]} tokens, {workload.output} out,"
        f" concurrency {args.concurrency}, {args.requests} requests, policy {policy.value},"
        f" in flight {args.max_inflight}",
        "slo_board_ms": args.slo,
        "time_scale": scale,
        "seed": args.seed,
    }
    return compare_json(header, out, args.margin)


def run(args: argparse.Namespace, measure_fn: Measure = measure) -> int:
    try:
        doc = compare(args, measure_fn)
    except CalculetError as err:
        return problem(f"bench compare: {err}")
    suite_dir = Path(args.dir).resolve()
    suite_dir.mkdir(parents=True, exist_ok=True)
    (suite_dir / "compare.json").write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    (suite_dir / "compare.md").write_text(markdown(doc), encoding="utf-8")
    console().print(render(doc))
    failed = [s["label"] for s in doc["sides"] if s["error"]]
    if failed:
        return problem(f"bench compare: the run of {', '.join(failed)} failed; see {suite_dir / 'compare.json'}")
    return EXIT_OK
