"""calctl's global flags, accepted before or after the command (as kubectl and docker users expect);
not a command itself (no COMMAND).

Owns: which flags are global (`--daemon`, `--gateway`, `--api-key-file`, `--json`, the TLS and
token flags of `access.py`) and `hoist_global_flags`, a pre-parse that moves the global flags given
before the command words to just after them, in their order:

    calctl --daemon X --json status          ->  calctl status --daemon=X --json
    calctl --json package validate DIR       ->  calctl package validate --json DIR

(a moved flag and its value become one `--flag=value` token), so that the command's own parser
sees every flag in command-line order, and a command that does not take a flag refuses it
("unrecognized arguments") wherever it was given. A flag given twice is a usage error (exit 2),
except `--daemon` of the fleet commands (status, top, rollout), which is repeatable, and `--json`,
which may be repeated harmlessly. Data flow: `calctl.main(argv)`
-> `hoist_global_flags(argv, command words)` -> argparse.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from calculet.ops.commands.access import ACCESS_FLAGS

VALUE_FLAGS = frozenset({"--daemon", "--gateway", "--api-key-file", *ACCESS_FLAGS})
SWITCHES = frozenset({"--json"})


def hoist_global_flags(argv: Sequence[str], commands: Iterable[Sequence[str]]) -> list[str]:
    """`argv` with the global flags that come before the command words moved to just after them.

    Args:
        argv: the command line without the program name.
        commands: every command's words, e.g. ("status",), ("package", "validate").

    Returns:
        The rearranged command line; `argv` unchanged when no global flag leads it, when something
        else (`--help`, an unknown flag) comes first, or when no command follows (argparse then
        reports the problem).
    """
    args = list(argv)
    hoisted, i = _leading_globals(args)
    if not hoisted:
        return args
    rest = args[i:]
    depth = _command_depth(rest, {tuple(words) for words in commands})
    if depth == 0:
        return args
    return [*rest[:depth], *hoisted, *rest[depth:]]


def _leading_globals(args: list[str]) -> tuple[list[str], int]:
    """The global flags (with their values) at the start of `args`, and where they end."""
    hoisted: list[str] = []
    i = 0
    while i < len(args):
        name, has_value, _ = args[i].partition("=")
        if (name in SWITCHES and not has_value) or (name in VALUE_FLAGS and has_value):
            hoisted.append(args[i])
            i += 1
        elif name in VALUE_FLAGS and i + 1 < len(args):
            hoisted.append(f"{name}={args[i + 1]}")  # one token: a command without the flag cannot
            i += 2  # take its value for a positional argument
        else:
            break
    return hoisted, i


def _command_depth(rest: list[str], commands: set[tuple[str, ...]]) -> int:
    """How many leading words of `rest` name a command (0 when they name none)."""
    prefixes = {words[:n] for words in commands for n in range(1, len(words) + 1)}
    depth = 0
    while depth < len(rest) and tuple(rest[: depth + 1]) in prefixes:
        depth += 1
    return depth
