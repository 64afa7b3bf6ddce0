"""Service-level objectives for goodput: `--slo ttft:MS,tpot:MS,e2e:MS` (any subset, milliseconds).

A request is *good* when it succeeded and each given objective holds: TTFT <= ttft, TPOT <= tpot
(a request of one output token has no TPOT and meets it, as in vLLM), E2E <= e2e. Goodput is good
requests per second of the measured window (summary module).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from calculet.common.errors import InvalidArgument
from calculet.ops.bench.latency import RequestLatency

SLO_KEYS = ("ttft", "tpot", "e2e")


@dataclass(frozen=True)
class Slo:
    """Objectives in seconds (None = not set)."""

    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None

    @classmethod
    def parse(cls, text: str) -> Slo:
        """`KEY:MS[,KEY:MS...]` with KEY in ttft, tpot, e2e, each once, MS a number > 0.

        Raises:
            InvalidArgument: an unknown or repeated key, or a value that is not a positive number.
        """
        values: dict[str, float] = {}
        for part in text.split(","):
            key, sep, ms_text = part.strip().partition(":")
            if not sep or key not in SLO_KEYS:
                raise InvalidArgument(f"--slo {text!r}: expected KEY:MS pairs with KEY in {', '.join(SLO_KEYS)}")
            if key in values:
                raise InvalidArgument(f"--slo {text!r}: {key} given twice")
            try:
                ms = float(ms_text)
            except ValueError:
                raise InvalidArgument(f"--slo {text!r}: {key}: {ms_text!r} is not a number of milliseconds") from None
            if not math.isfinite(ms) or ms <= 0:
                raise InvalidArgument(f"--slo {text!r}: {key}: must be a positive number of milliseconds")
            values[key] = ms / 1000.0
        return cls(values.get("ttft"), values.get("tpot"), values.get("e2e"))

    @property
    def given(self) -> bool:
        return any(v is not None for v in (self.ttft_s, self.tpot_s, self.e2e_s))

    def met(self, latency: RequestLatency) -> bool:
        """Whether a successful request meets every objective."""
        tpot = latency.tpot if latency.tpot is not None else 0.0
        pairs = ((self.ttft_s, latency.ttft), (self.tpot_s, tpot), (self.e2e_s, latency.e2e))
        return all(limit is None or value <= limit for limit, value in pairs)

    def as_ms(self) -> dict[str, float]:
        pairs = zip(SLO_KEYS, (self.ttft_s, self.tpot_s, self.e2e_s), strict=True)
        return {key: value * 1000.0 for key, value in pairs if value is not None}
