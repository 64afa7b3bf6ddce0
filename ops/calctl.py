"""`calctl`, the operators' CLI: a thin argparse front over command modules.

Each module in `calculet.ops.commands` that defines `COMMAND` (a tuple of words such as
("package", "validate")), `HELP`, `add_arguments(parser)` and `run(args) -> int` becomes a
subcommand; this file only builds the parser tree and maps exit codes. COMMAND and HELP are read
from each module's source, and only the module of the command that runs is imported, so a quick
command does not pay for the imports of the heavy ones (soak, bench). Exit codes: 0 success, 1 the
operation found a problem (invalid package, does not fit, daemon refused), 2 usage error
(argparse's, or a `UsageError` a command raises for a combination of flags).
Global flags (`--daemon`, `--json`, TLS and token, `--gateway`) may come before the command:
`commands.global_flags.hoist_global_flags` moves them after it before argparse runs.
A command may also have sub-commands (`bench` and `bench suite`): modules are read in name order,
so the shorter command's module (bench.py) comes before its sub-command's (bench_suite.py); the
sub-command's flags and defaults override the command's own.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import functools
import importlib
import pkgutil
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import calculet.ops.commands as commands_pkg
from calculet.common import process_start
from calculet.common.errors import CalculetError
from calculet.ops.commands.daemon_cmds import UsageError
from calculet.ops.commands.global_flags import hoist_global_flags

EXIT_OK, EXIT_PROBLEM, EXIT_USAGE = 0, 1, 2


@dataclass(frozen=True)
class CommandSpec:
    """A command module as read from its source, before (or without) importing it."""

    module: str  # its full name
    words: tuple[str, ...]  # COMMAND
    help: str  # HELP


@functools.cache
def command_specs() -> tuple[CommandSpec, ...]:
    """Every command module's COMMAND and HELP, in module name order, read from their sources: a
    command's imports (the soak's and the bench's pull in the OpenAI SDK and more) are paid only by
    the command that runs. A module whose COMMAND or HELP is not a literal is imported to read them."""
    specs = []
    for info in sorted(pkgutil.iter_modules(commands_pkg.__path__), key=lambda i: i.name):
        name = f"{commands_pkg.__name__}.{info.name}"
        constants = _literal_constants(Path(commands_pkg.__path__[0]) / f"{info.name}.py")
        if constants is None:  # a helper module (no COMMAND): nothing to import
            continue
        if "COMMAND" not in constants or "HELP" not in constants:
            mod = importlib.import_module(name)
            if not hasattr(mod, "COMMAND"):
                continue
            constants = {"COMMAND": mod.COMMAND, "HELP": mod.HELP}
        specs.append(CommandSpec(name, tuple(constants["COMMAND"]), str(constants["HELP"])))
    return tuple(specs)


def _literal_constants(path: Path) -> dict[str, Any] | None:
    """The module-level `COMMAND = ...` and `HELP = ...` of `path` that are literals (ast); None when
    the module assigns no COMMAND at all (a helper of the commands). A source that cannot be read or
    parsed gives {}, so the module is imported and its error shows."""
    found: dict[str, Any] = {}
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError):
        return found
    assigned = False
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name, value = node.targets[0].id, node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            name, value = node.target.id, node.value
        else:
            continue
        assigned = assigned or name == "COMMAND"
        if name in ("COMMAND", "HELP"):
            with contextlib.suppress(ValueError):  # not a literal: the module is imported instead
                found[name] = ast.literal_eval(value)
    return found if assigned else None


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser of every command; with `argv` (the command line, global flags hoisted), only the
    commands it names (and the commands above them, such as `bench` for `bench suite`) are imported
    and get their flags: the others are listed with their help and take none."""
    parser = argparse.ArgumentParser(
        prog="calctl",
        description="Operate Calculet boards and packages.",
        epilog="Global flags (--daemon, --gateway, --json, --tls-*, --token-file) go before or after the command.",
    )
    groups: dict[tuple[str, ...], Any] = {(): parser.add_subparsers(dest="command", metavar="COMMAND")}
    leaves: dict[tuple[str, ...], argparse.ArgumentParser] = {}
    for spec in command_specs():
        words = spec.words
        for depth in range(1, len(words)):
            prefix = words[:depth]
            if prefix not in groups and prefix in leaves:  # a command with sub-commands ("bench suite")
                groups[prefix] = leaves[prefix].add_subparsers(dest=f"sub{depth}", metavar="COMMAND")
            if prefix not in groups:
                word = words[depth - 1]
                group = groups[words[: depth - 1]].add_parser(word, help=f"{word} commands")
                groups[prefix] = group.add_subparsers(dest=f"sub{depth}", metavar="COMMAND")
        sub = groups[words[:-1]].add_parser(words[-1], help=spec.help, description=spec.help)
        if argv is None or _named(words, argv):
            mod = importlib.import_module(spec.module)
            mod.add_arguments(sub)
            sub.set_defaults(_run=mod.run, _parser=sub)
        leaves[words] = sub
    return parser


def _named(words: tuple[str, ...], argv: Sequence[str]) -> bool:
    """`argv` runs this command or one below it: its words lead the command line."""
    return tuple(argv[: len(words)]) == words


def main(argv: Sequence[str] | None = None) -> int:
    process_start.one_blas_thread()  # before a command's imports: `up`, `bench`, `soak` and `package` load numpy
    argv = hoist_global_flags(sys.argv[1:] if argv is None else argv, (spec.words for spec in command_specs()))
    parser = build_parser(argv)
    args = parser.parse_args(argv)
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
