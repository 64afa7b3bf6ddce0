"""`calctl package validate DIR`: check a model package and list every problem.

Argument checks only (DIR must be an existing directory, else usage error, exit 2; a DIR that is
a symlink loop is the package's defect, reported as file.symlink_loop, exit 1); the work is
`calculet.daemon.package.validate.validate_package` against the calsim board. Prints one line
per problem then a summary, or the report as JSON. Exit 0 valid (warnings allowed), 1 invalid.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from calculet.daemon.package.fs import is_symlink_loop
from calculet.daemon.package.validate import validate_package

COMMAND = ("package", "validate")
HELP = "Check a model package directory and list every problem (exit 1 if any error)."
EXIT_OK, EXIT_INVALID = 0, 1


def existing_dir(text: str) -> Path:
    """argparse type: an existing directory (or a symlink loop, which the validator reports).

    Raises:
        argparse.ArgumentTypeError: the path does not exist or is not a directory.
    """
    path = Path(text)
    if is_symlink_loop(path):
        return path
    if not path.exists():
        raise argparse.ArgumentTypeError(f"{text}: no such directory")
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: not a directory")
    return path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dir", type=existing_dir, metavar="DIR", help="the package directory")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--skip-hashes", action="store_true", help="check file sizes but not SHA-256 (quick look at big packages)"
    )


def run(args: argparse.Namespace) -> int:
    report = validate_package(args.dir, verify_hashes=not args.skip_hashes)
    print(report.to_json() if args.json else report.render_text())
    return EXIT_OK if report.ok else EXIT_INVALID
