"""argparse types of the bench commands (`calctl bench`, its multi-turn flags, `calctl bench suite`).

Each turns a parser that raises `InvalidArgument` into an argparse type, so a malformed value is a
usage error (exit 2) that names the flag and says what was expected.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import Any

from calculet.common.errors import InvalidArgument


def typed_arg(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """An argparse type from a parser that raises InvalidArgument (a usage error, exit 2)."""

    def convert(text: str) -> Any:
        try:
            return parse(text)
        except InvalidArgument as err:
            raise argparse.ArgumentTypeError(str(err)) from None

    return convert


def count_arg(minimum: int) -> Callable[[str], int]:
    """argparse type: a whole number >= `minimum`."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise InvalidArgument(f"{text!r}: expected a whole number") from None
        if value < minimum:
            raise InvalidArgument(f"{text!r}: must be at least {minimum}")
        return value

    return typed_arg(parse)


def positive_arg(*, allow_inf: bool) -> Callable[[str], float]:
    """argparse type: a number > 0 (and `inf` when allowed)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise InvalidArgument(f"{text!r}: expected a number") from None
        if math.isnan(value) or value <= 0 or (math.isinf(value) and not allow_inf):
            raise InvalidArgument(f"{text!r}: must be a number > 0{' (or inf)' if allow_inf else ''}")
        return value

    return typed_arg(parse)


def parse_non_negative(text: str) -> float:
    """A finite number >= 0. Raises InvalidArgument otherwise."""
    try:
        value = float(text)
    except ValueError:
        raise InvalidArgument(f"{text!r}: expected a number") from None
    if not math.isfinite(value) or value < 0:
        raise InvalidArgument(f"{text!r}: must be a finite number >= 0")
    return value


non_negative_arg = typed_arg(parse_non_negative)
