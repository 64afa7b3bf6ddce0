"""`calctl capacity`: per-chip memory plan of a package or preset for lanes x context choices.

Argument checks only (positive integers, an existing package directory, usage errors exit 2);
the arithmetic is `calculet.daemon.package.capacity`, the same the validator uses. Prints, per
(lanes, context) choice and chip: params DRAM, KV, workspace, total, DRAM, headroom, and whether
it fits; then the longest context per lane count and the most lanes per context. With --package
the package's own layout (kv.lanes x kv.lane_context) is evaluated too. With --package and
--daemon, the board's measured figures for that package sit beside the plan: every resident model
whose package hash is this manifest's, per chip, the planner's figure for the layout it was
configured with, what its configure took on the device, and their difference (Status
`ModelStatus.memory`; `memory_view.model_memory_table`). Exit 1 when any choice (or the package's
own layout) does not fit, else 0.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from dataclasses import replace
from typing import Any

from rich.console import Console
from rich.table import Table

from calculet.daemon.package.capacity import (
    CALSIM_BOARD,
    CapacityPlan,
    CapacityRow,
    MemoryModel,
    evaluate,
    max_context_for,
    max_lanes_for,
    plan,
)
from calculet.daemon.package.manifest import MANIFEST_NAME, load_manifest
from calculet.daemon.package.presets import GIB, PRESETS
from calculet.ops.commands.daemon_cmds import UsageError, add_daemon_arguments, connect
from calculet.ops.commands.memory_view import memory_json, model_memory_table
from calculet.ops.commands.package_validate import existing_dir
from calculet.v1 import observe_pb2

COMMAND = ("capacity",)
HELP = "Per-chip DRAM plan (params + KV + workspace) for lanes x context choices (exit 1 if one does not fit)."
EXIT_OK, EXIT_DOES_NOT_FIT = 0, 1


def positive_int(text: str) -> int:
    """argparse type. Raises argparse.ArgumentTypeError unless `text` is an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value}: must be >= 1")
    return value


def positive_float(text: str) -> float:
    """argparse type. Raises argparse.ArgumentTypeError unless `text` is a number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text}: must be > 0")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--package", type=existing_dir, metavar="DIR", help="plan a package's manifest")
    source.add_argument("--preset", choices=sorted(PRESETS), help="plan a built-in model preset")
    parser.add_argument("--lanes", type=positive_int, nargs="+", metavar="N", help="lane counts (default: own)")
    parser.add_argument("--context", type=positive_int, nargs="+", metavar="N", help="tokens per lane (default: own)")
    parser.add_argument("--dram-gib", type=positive_float, metavar="X", help="DRAM per chip in GiB (default 16)")
    add_daemon_arguments(parser)  # --json, and --daemon: the board whose measured figures go beside the plan


def _gib(n: int) -> str:
    return f"{n / GIB:.3f}"


def _table(p: CapacityPlan, own: CapacityRow | None) -> Table:
    table = Table(
        title=f"{p.model}: per-chip DRAM (GiB) on {p.device.chips} chips x {_gib(p.device.dram_bytes_per_chip)}"
    )
    for name in ("lanes", "context", "chip", "params", "KV", "workspace", "total", "DRAM", "headroom", "fits"):
        table.add_column(name, justify="left" if name == "fits" else "right", no_wrap=True)
    rows = ([("own", own)] if own else []) + [("", r) for r in p.rows]
    for label, row in rows:
        for c in row.chips:
            fits = "yes" if row.fits else "NO"
            lanes = f"{row.lanes} ({label})" if label else str(row.lanes)
            table.add_row(
                lanes,
                f"{row.context:,}",
                str(c.chip),
                _gib(c.params_dram),
                _gib(c.kv),
                _gib(c.workspace),
                _gib(c.dram_total),
                _gib(c.dram_limit),
                _gib(c.dram_headroom),
                fits,
            )
    return table


def _measured(args: argparse.Namespace) -> list[observe_pb2.ModelStatus]:
    """The board's resident models serving `--package` (same manifest hash); [] without `--daemon`.

    Raises:
        UsageError: --daemon without --package.
        CalculetError: the daemon cannot be asked.
    """
    if args.daemon is None:
        return []
    if args.package is None:
        raise UsageError("--daemon goes with --package (the board's figures are matched by the package's hash)")
    digest = hashlib.sha256((args.package / MANIFEST_NAME).read_bytes()).hexdigest()
    with connect(args) as client:
        status = client.status()
    return [m for m in status.models if m.package_hash == digest]


def run(args: argparse.Namespace) -> int:
    measured = _measured(args)
    if args.package is not None:
        model = MemoryModel.from_manifest(load_manifest(args.package))
    else:
        model = MemoryModel.from_preset(PRESETS[args.preset])
    device = CALSIM_BOARD
    if args.dram_gib is not None:
        device = replace(device, dram_bytes_per_chip=int(args.dram_gib * GIB))
    lanes = args.lanes or [model.lanes]
    contexts = args.context or [model.lane_context]
    p = plan(model, lanes, contexts, device)
    own = evaluate(model, model.lanes, model.lane_context, device) if args.package is not None else None
    asked = {(r.lanes, r.context) for r in p.rows}
    own_extra = own if own is not None and (own.lanes, own.context) not in asked else None
    max_ctx = {n: max_context_for(model, n, device) for n in dict.fromkeys(lanes)}
    max_lanes = {c: max_lanes_for(model, c, device) for c in dict.fromkeys(contexts)}
    fits = p.fits and (own is None or own.fits)
    if args.json:
        out: dict[str, Any] = p.to_dict()
        out["fits"] = fits
        out["package_layout"] = None if own is None else {"lanes": own.lanes, "context": own.context, "fits": own.fits}
        out["max_context_for_lanes"] = {str(k): v for k, v in max_ctx.items()}
        out["max_lanes_for_context"] = {str(k): v for k, v in max_lanes.items()}
        if args.daemon is not None:
            out["measured"] = memory_json(measured)
        print(json.dumps(out, indent=2))
        return EXIT_OK if fits else EXIT_DOES_NOT_FIT
    console = Console() if sys.stdout.isatty() else Console(width=140)
    console.print(_table(p, own_extra))
    for n, ctx in max_ctx.items():
        console.print(f"longest context for {n} lane(s): {ctx:,} tokens")
    for c, n in max_lanes.items():
        console.print(f"most lanes at {c:,} tokens: {n}")
    for row in ([own_extra] if own_extra else []) + list(p.rows):
        if not row.fits:
            console.print(f"does not fit: {row.lanes} lane(s) x {row.context:,} tokens: {row.reason}")
    console.print("all choices fit" if fits else "some choices do NOT fit")
    if args.daemon is not None:
        console.print(model_memory_table(measured) if measured else "the board holds no model of this package")
    return EXIT_OK if fits else EXIT_DOES_NOT_FIT
