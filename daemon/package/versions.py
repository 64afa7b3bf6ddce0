"""Dotted-integer versions and `>=A,<B` ranges for the manifest's compatibility section.

This module owns the tiny grammar a package uses to say which runtime/driver it runs on:
comma-separated clauses `OP VERSION` with OP one of >=, >, <=, <, ==, != and VERSION dotted
integers (`0.7.6`), or `*` for any version. Versions compare as integer tuples padded with zeros,
so `0.8` == `0.8.0`. Anything else is a syntax error; nothing is guessed.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable

from calculet.common.errors import InvalidArgument

# Whole-string patterns (used with fullmatch: `$` also matches before a trailing newline), ASCII
# digits only (`\d` is any Unicode digit, which int() would then accept).
_VERSION = re.compile(r"[0-9]+(\.[0-9]+)*")
_CLAUSE = re.compile(r"(>=|<=|==|!=|>|<)\s*(\S+)")
_RELEASE = re.compile(r"\s*([0-9]+(?:\.[0-9]+)*)(?:[-+].*)?\s*")
_OPS: dict[str, Callable[[tuple[int, ...], tuple[int, ...]], bool]] = {
    ">=": operator.ge,
    ">": operator.gt,
    "<=": operator.le,
    "<": operator.lt,
    "==": operator.eq,
    "!=": operator.ne,
}


def parse_version(text: str) -> tuple[int, ...]:
    """`"0.7.6"` -> `(0, 7, 6)`.

    Raises:
        InvalidArgument: not dotted integers.
    """
    text = text.strip()
    if not _VERSION.fullmatch(text):
        raise InvalidArgument(f"version {text!r} is not dotted integers like 0.7.6")
    return tuple(int(p) for p in text.split("."))


def release_part(text: str) -> str:
    """The dotted-integer release of a device-reported version: `"0.7.6-calsim"` -> `"0.7.6"`
    (a `-` or `+` suffix is build metadata, as in semver).

    Raises:
        InvalidArgument: the text does not start with dotted integers.
    """
    m = _RELEASE.fullmatch(text)
    if not m:
        raise InvalidArgument(f"version {text!r} does not start with dotted integers like 0.7.6")
    return m.group(1)


def _pad(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    n = max(len(a), len(b))
    return a + (0,) * (n - len(a)), b + (0,) * (n - len(b))


def parse_range(spec: str) -> list[tuple[str, tuple[int, ...]]]:
    """`">=0.7.6,<0.8"` -> `[(">=", (0, 7, 6)), ("<", (0, 8))]`; `"*"` -> `[]` (any version).

    Raises:
        InvalidArgument: empty spec, a clause without an operator, or a bad version.
    """
    if spec.strip() == "*":
        return []
    clauses = [c.strip() for c in spec.split(",")]
    if not spec.strip() or any(not c for c in clauses):
        raise InvalidArgument(f"version range {spec!r} has an empty clause")
    out = []
    for clause in clauses:
        m = _CLAUSE.fullmatch(clause)
        if not m:
            raise InvalidArgument(f"version range clause {clause!r} needs an operator (>=, >, <=, <, ==, !=)")
        out.append((m.group(1), parse_version(m.group(2))))
    return out


def in_range(version: str, spec: str) -> bool:
    """Whether `version` satisfies every clause of `spec`.

    Raises:
        InvalidArgument: either string is malformed.
    """
    v = parse_version(version)
    return all(_OPS[op](*_pad(v, bound)) for op, bound in parse_range(spec))
