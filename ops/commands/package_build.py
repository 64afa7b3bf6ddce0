"""`calctl package build-sim`: write a calsim model package from a preset.

Parses and checks the arguments (a malformed `--decode-batch`, `--lanes` or `--lane-context`
is a usage error, exit 2), then hands over to `calculet.ops.sim_packages.build_sim_package`.
A non-empty OUT without `--force`, or KV that does not fit, is a problem (exit 1, through
calctl's CalculetError mapping).
"""

from __future__ import annotations

import argparse
import sys

from calculet.common.errors import InvalidArgument
from calculet.ops.sim_packages import PRESETS, build_sim_package
from calculet.ops.sim_packages.build import check_decode_batches
from calculet.ops.sim_packages.parallelism import TRAFFIC

COMMAND = ("package", "build-sim")
HELP = (
    "Write a calsim model package: 'tiny' (numeric kernel), 'qwen3-30b-a3b', 'qwen3-30b-a3b-b1' (today's "
    "batch-1 calbin) or 'qwen3-4b' (synthetic kernel)."
)
EXIT_OK, EXIT_USAGE = 0, 2


def parse_decode_batches(text: str) -> tuple[int, ...]:
    """`"1,4,8"` -> (1, 4, 8).

    Raises:
        argparse.ArgumentTypeError: an empty item, a non-number, a value out of range, a duplicate.
    """
    items = [s.strip() for s in text.split(",")]
    try:
        values = [int(s) for s in items]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated integers, e.g. 1,4,8,16") from None
    try:
        return check_decode_batches(values)
    except InvalidArgument as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def positive_int(text: str) -> int:
    """Raises argparse.ArgumentTypeError unless `text` is an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value}: must be >= 1")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preset", required=True, choices=sorted(PRESETS), help="which package to build")
    parser.add_argument(
        "--decode-batch",
        type=parse_decode_batches,
        default=None,
        metavar="B[,B...]",
        help="decode submodel batch sizes (default: tiny 1,4; qwen3-30b-a3b 1,4,8,16; qwen3-30b-a3b-b1 1, only; "
        "qwen3-4b 1,4,8)",
    )
    parser.add_argument("--lanes", type=positive_int, default=None, help="KV lanes (default: largest batch)")
    parser.add_argument(
        "--lane-context",
        type=positive_int,
        default=None,
        metavar="N",
        help="tokens per lane (default: largest multiple of 256 that fits DRAM, at most the calbin context)",
    )
    parser.add_argument(
        "--chip", type=int, default=None, metavar="N", help="the chip a single-chip preset runs on (qwen3-4b: 0 or 1)"
    )
    parser.add_argument(
        "--logits-topk",
        type=positive_int,
        default=0,
        metavar="K",
        help="decode jobs return each row's top K logits (logits_output mode topk), not the full row (default: full)",
    )
    parser.add_argument(
        "--parallelism",
        choices=sorted(TRAFFIC),
        default=None,
        help="build as this split over the 2 chips, its cross-chip traffic declared (topology.d2d), for"
        " `calctl bench compare` (default: the preset's, none declared)",
    )
    parser.add_argument("--force", action="store_true", help="replace OUT if it is not empty")
    parser.add_argument("out", metavar="OUT", help="package directory to write")


def run(args: argparse.Namespace) -> int:
    try:
        path = build_sim_package(
            args.preset,
            args.out,
            args.decode_batch,
            args.lanes,
            args.lane_context,
            force=args.force,
            chip=args.chip,
            logits_topk=args.logits_topk,
            parallelism=args.parallelism,
        )
    except InvalidArgument as exc:
        # Option combinations argparse cannot see (lanes vs batch, context vs calbin) are usage errors.
        print(f"calctl: {exc.kind.value}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(path)
    return EXIT_OK
