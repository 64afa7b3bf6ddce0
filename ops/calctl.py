"""`calctl`, the operators' CLI: a thin argparse front over command modules.

Each module in `calculet.ops.commands` that defines `COMMAND` (a tuple of words such as
("package", "validate")), `HELP`, `add_arguments(parser)` and `run(args) -> int` becomes a
subcommand; this file only builds the parser tree and maps exit codes. Exit codes: 0 success,
1 the operation found a problem (invalid package, does not fit, daemon refused), 2 usage error
(argparse's, or a `UsageError` a command raises for a combination of flags).
Global flags (`--daemon`, `--json`, TLS and token, `--gateway`) may come before the command:
`commands.global_flags.hoist_global_flags` moves them after it before argparse runs.
A command may also have sub-commands (`bench` and `bench suite`): modules are read in name order,
so the shorter command's module (bench.py) comes before its sub-command's (bench_suite.py); the
sub-command's flags and defaults override the command's own.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import calculet.ops.commands as commands_pkg
from calculet.common.errors import CalculetError
from calculet.ops.commands.daemon_cmds import UsageError
from calculet.ops.commands.global_flags import hoist_global_flags

EXIT_OK, EXIT_PROBLEM, EXIT_USAGE = 0, 1, 2


def _command_modules() -> list[ModuleType]:
    mods = []
    for info in sorted(pkgutil.iter_modules(commands_pkg.__path__), key=lambda i: i.name):
        mod = importlib.import_module(f"{commands_pkg.__name__}.{info.name}")
        if hasattr(mod, "COMMAND"):
            mods.append(mod)
    return mods


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="calctl",
        description="Operate Calculet boards and packages.",
        epilog="Global flags (--daemon, --gateway, --json, --tls-*, --token-file) go before or after the command.",
    )
    groups: dict[tuple[str, ...], Any] = {(): parser.add_subparsers(dest="command", metavar="COMMAND")}
    leaves: dict[tuple[str, ...], argparse.ArgumentParser] = {}
    for mod in _command_modules():
        words: tuple[str, ...] = tuple(mod.COMMAND)
        for depth in range(1, len(words)):
            prefix = words[:depth]
            if prefix not in groups and prefix in leaves:  # a command with sub-commands ("bench suite")
                groups[prefix] = leaves[prefix].add_subparsers(dest=f"sub{depth}", metavar="COMMAND")
            if prefix not in groups:
                word = words[depth - 1]
                group = groups[words[: depth - 1]].add_parser(word, help=f"{word} commands")
                groups[prefix] = group.add_subparsers(dest=f"sub{depth}", metavar="COMMAND")
        sub = groups[words[:-1]].add_parser(words[-1], help=mod.HELP, description=mod.HELP)
        mod.add_arguments(sub)
        sub.set_defaults(_run=mod.run, _parser=sub)
        leaves[words] = sub
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(hoist_global_flags(argv, (tuple(m.COMMAND) for m in _command_modules())))
    run: Callable[[argparse.Namespace], int] | None = getattr(args, "_run", None)
    if run is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        return run(args)
    except UsageError as exc:
        command_parser: argparse.ArgumentParser = args._parser
        command_parser.error(str(exc))  # exits 2 with the command's usage
    except CalculetError as exc:
        print(f"calctl: {exc.kind.value}: {exc}", file=sys.stderr)
        return EXIT_PROBLEM


if __name__ == "__main__":
    sys.exit(main())
