"""`make run`: two calsim boards serving Qwen3-30B-A3B behind the gateway, in the foreground.

Builds and validates the qwen3-30b-a3b calsim package (once), prints its capacity plan, then runs
`calctl up --boards 2 --preset qwen3-30b-a3b --time-scale 1 --dir run` (the processes, banner and
Ctrl-C handling are `calctl up`'s). `--dir`, `--time-scale` and `--policy` pass through.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from calculet.ops import calctl
from calculet.ops.commands.up import ensure_package
from calculet.ops.fleet import FleetError

BOARDS = 2
PRESET = "qwen3-30b-a3b"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="run_local", description=__doc__)
    parser.add_argument("--dir", type=Path, default=Path("run"), help="working directory (packages, sockets, logs)")
    parser.add_argument("--time-scale", default="1", help="calsim time scale (1 = the board's real speed)")
    parser.add_argument("--policy", default="continuous", choices=("continuous", "serial"))
    return parser


def up_argv(args: argparse.Namespace) -> list[str]:
    """The `calctl up` arguments `make run` stands for."""
    return [
        "up", "--boards", str(BOARDS), "--preset", PRESET,
        "--time-scale", str(args.time_scale), "--dir", str(args.dir), "--policy", args.policy,
    ]  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    """Returns `calctl up`'s exit code (1 if the package cannot be built or is invalid)."""
    args = build_parser().parse_args(argv)
    try:
        package = ensure_package(args.dir / "models", PRESET, lambda text: print(text, flush=True))
    except FleetError as exc:
        print(f"run_local: {exc}", file=sys.stderr)
        return 1
    print(f"== capacity plan of {package}", flush=True)
    calctl.main(["capacity", "--package", str(package)])
    return calctl.main(up_argv(args))


if __name__ == "__main__":
    sys.exit(main())
