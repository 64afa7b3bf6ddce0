"""`RequestPoint`: what the soak keeps of one request once it is judged (a few numbers, no text),
so a day-long run holds a million of them in modest memory.

TTFT is taken for streamed requests that received text (cut ones too: their first token is real);
TPOT only for streamed single-choice requests that completed (`ok`) with more than one output
token: `(end - first token) / (completion_tokens - 1)`, as `calctl bench` defines it. Times are
seconds since the soak phase started.
"""

from __future__ import annotations

from dataclasses import dataclass

from calculet.ops.soak.classify import Judgement, RequestClass
from calculet.ops.soak.exchange import Exchange


@dataclass(frozen=True, slots=True)
class RequestPoint:
    """One judged request (module docstring)."""

    start_s: float
    end_s: float
    cls: RequestClass
    kind: str
    ttft_s: float | None = None
    tpot_s: float | None = None
    output_tokens: int = 0


def point_of(got: Exchange, judgement: Judgement, kind: str, origin: float) -> RequestPoint:
    """The point of a judged exchange; `origin` is the clock reading of the soak phase's start."""
    end = got.end if got.end is not None else got.start
    ttft = got.first_token - got.start if got.stream and got.first_token is not None else None
    tpot = None
    tokens = got.completion_tokens or 0
    if ttft is not None and judgement.cls is RequestClass.OK and got.n == 1 and tokens > 1 and got.first_token:
        tpot = (end - got.first_token) / (tokens - 1)
    counted = tokens if judgement.cls is RequestClass.OK else 0
    return RequestPoint(got.start - origin, end - origin, judgement.cls, kind, ttft, tpot, counted)
