"""Durations on the command line: `90s`, `2m`, `30m`, `2h`, `1.5h`, or plain seconds.

Pure functions; `parse_duration` raises ValueError with a sentence for anything else, which the
command turns into a usage error.
"""

from __future__ import annotations

import math
import re

UNIT_SECONDS = {"s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*$")


def parse_duration(text: str) -> float:
    """Seconds of `text`: a number followed by s, m or h (no unit: seconds).

    Raises:
        ValueError: not such a number, or not finite and > 0.
    """
    match = _DURATION.match(text.lower())
    if match is None:
        raise ValueError(f"{text!r}: expected a duration such as 90s, 2m, 30m or 2h")
    seconds = float(match.group(1)) * UNIT_SECONDS[match.group(2) or "s"]
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"{text!r}: must be more than 0 seconds")
    return seconds


def format_duration(seconds: float) -> str:
    """`2h`, `30m`, `90s`, `1h30m`: whole units where they fit (seconds rounded)."""
    total = round(seconds)
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{hours}h" if hours else "", f"{minutes}m" if minutes else "", f"{secs}s" if secs else ""]
    return "".join(parts) or "0s"
