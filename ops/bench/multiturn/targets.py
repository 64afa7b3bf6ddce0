"""Issue 19's targets ("conversations that do not pay twice"), as checks on measured figures.

- cache: from turn 2 on, at least `CACHED_SHARE_MIN` of the prompt tokens are served from cache;
- TTFT: the TTFT p50 of turns >= 2 is at most `TTFT_FACTOR` x the modelled cost of the uncached
  part (its prefill plus one decode step, `model_cost`) + `TTFT_SLACK_S`;
- reuse: output throughput with prefix reuse on at least `REUSE_SPEEDUP_MIN` x with it off;
- scaling: 4 boards at least `SCALING_MIN` x one board.

A `TargetCheck` says what was wanted, what was measured and whether it was met; `met` is None when the
figure could not be measured (no completed request, no timing model). Used by the bench report (the
two per-run targets) and the suite report (all four, across its runs). Pure functions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

CACHED_SHARE_MIN = 0.9
TTFT_FACTOR = 1.2
TTFT_SLACK_S = 0.050
REUSE_SPEEDUP_MIN = 3.0
SCALING_MIN = 3.6


@dataclass(frozen=True)
class TargetCheck:
    """One target's verdict.

    Attributes:
        name: what is checked (`cache`, `ttft`, `reuse`, `scaling`).
        wanted: the target in words.
        measured: the measured figure in `unit`, None when unmeasured.
        met: whether it holds; None when it could not be checked.
        detail: how the figure was made (the inputs), or why it is missing.
        unit: `share` (0..1), `s` (seconds) or `x` (a ratio).
    """

    name: str
    wanted: str
    measured: float | None
    met: bool | None
    detail: str
    unit: str

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "wanted": self.wanted,
            "measured": self.measured,
            "unit": self.unit,
            "met": self.met,
            "detail": self.detail,
        }

    def shown(self) -> str:
        """The measured figure for people: `93.1 %`, `212.0 ms`, `3.42 x`, or `n/a`."""
        if self.measured is None:
            return "n/a"
        return {"share": f"{100 * self.measured:.1f} %", "s": f"{1000 * self.measured:.1f} ms"}.get(
            self.unit, f"{self.measured:.2f} x"
        )


def cache_target(later_share: float | None) -> TargetCheck:
    """The cached share of turns >= 2 against `CACHED_SHARE_MIN`."""
    wanted = f"turns >= 2: >= {CACHED_SHARE_MIN:.0%} of prompt tokens from cache"
    if later_share is None:
        return TargetCheck("cache", wanted, None, None, "no completed request of turn 2 or later", "share")
    return TargetCheck("cache", wanted, later_share, later_share >= CACHED_SHARE_MIN, "cached / prompt tokens", "share")


def ttft_bound_s(modelled_s: float) -> float:
    return TTFT_FACTOR * modelled_s + TTFT_SLACK_S


def ttft_target(ttft_p50_s: float | None, modelled_p50_s: float | None) -> TargetCheck:
    """The TTFT p50 of turns >= 2 against `TTFT_FACTOR` x the modelled uncached cost + the slack
    (`modelled_p50_s` already in wall seconds: modelled x time scale)."""
    slack = f"{TTFT_SLACK_S * 1000:g} ms"
    wanted = f"turns >= 2: TTFT p50 <= {TTFT_FACTOR:g} x modelled uncached prefill + 1 decode step + {slack}"
    if ttft_p50_s is None:
        return TargetCheck("ttft", wanted, None, None, "no completed request of turn 2 or later", "s")
    if modelled_p50_s is None:
        return TargetCheck("ttft", wanted, ttft_p50_s, None, "no timing model (--timing-package)", "s")
    bound = ttft_bound_s(modelled_p50_s)
    detail = f"bound {bound * 1000:.1f} ms (modelled p50 {modelled_p50_s * 1000:.1f} ms)"
    return TargetCheck("ttft", wanted, ttft_p50_s, ttft_p50_s <= bound, detail, "s")


def ratio_target(
    name: str, wanted: str, numerator: float | None, denominator: float | None, minimum: float
) -> TargetCheck:
    """`numerator / denominator >= minimum` (None when either is missing or the denominator is 0)."""
    if numerator is None or denominator is None or denominator <= 0:
        return TargetCheck(name, wanted, None, None, "a run it compares is missing or measured nothing", "x")
    ratio = numerator / denominator
    return TargetCheck(name, wanted, ratio, ratio >= minimum, f"{numerator:.1f} / {denominator:.1f}", "x")
