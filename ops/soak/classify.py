"""Judging one request against its reference answer (the oracle).

- `ok`: it completed and every choice's text equals the reference's.
- `cancelled`: the client cut it on purpose (closed the stream after k chunks, or its own timeout)
  and every text so far is a prefix of the reference's. Passes, like ok.
- `crossed`: a text differs from the reference (for a cut or failed request: is not a prefix of
  it). Always fails the run.
- `lost`: no complete answer and no error: a choice without `finish_reason`, a broken connection,
  no answer within the lost timeout. Always fails the run.
- `failed`: an error (HTTP status or in-band), its texts so far a prefix of the reference's. Fails
  the run unless `policy` allows it (and allowed ones stay under its rate).

Pure functions of an `Exchange` and the reference texts; no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from calculet.ops.soak.exchange import Exchange
from calculet.ops.soak.policy import allowed_rule


class RequestClass(Enum):
    """How a request ended, judged against the reference (module docstring)."""

    OK = "ok"
    CANCELLED = "cancelled"
    CROSSED = "crossed"
    LOST = "lost"
    FAILED = "failed"


@dataclass(frozen=True)
class Judgement:
    """A request's class, the policy rule that allows a failure (None: not a failure, or
    disallowed), and one line saying why (empty for ok)."""

    cls: RequestClass
    allowed_by: str | None = None
    detail: str = ""

    @property
    def disallowed_failure(self) -> bool:
        return self.cls is RequestClass.FAILED and self.allowed_by is None


def classify(got: Exchange, reference: Sequence[str]) -> Judgement:
    """Judge `got` against `reference` (one text per choice; module docstring)."""
    if len(reference) != got.n:
        return Judgement(RequestClass.CROSSED, None, f"the reference has {len(reference)} choices, the request {got.n}")
    whole = got.error is None and got.cut is None
    for i, (text, ref) in enumerate(zip(got.texts, reference, strict=True)):
        if whole and got.finishes[i] is not None and text != ref:
            return Judgement(RequestClass.CROSSED, None, f"choice {i}: {_diff(text, ref)}")
        if not ref.startswith(text):
            detail = f"choice {i} is not a prefix of the reference: {_diff(text, ref)}"
            return Judgement(RequestClass.CROSSED, None, detail)
    if got.error is not None:
        if got.error.kind in ("timeout", "connection"):
            return Judgement(RequestClass.LOST, None, got.error.describe())
        rule = allowed_rule(got.error.status, got.error.code, got.error.message)
        return Judgement(RequestClass.FAILED, rule, got.error.describe())
    if got.cut is not None:
        return Judgement(RequestClass.CANCELLED, None, f"cut by the client ({got.cut})")
    unfinished = [i for i, f in enumerate(got.finishes) if f is None]
    if unfinished:
        return Judgement(RequestClass.LOST, None, f"choice(s) {unfinished} ended without finish_reason")
    return Judgement(RequestClass.OK)


def _diff(text: str, ref: str) -> str:
    """Where two texts part, with a little context, bounded."""
    at = next((i for i, (a, b) in enumerate(zip(text, ref, strict=False)) if a != b), min(len(text), len(ref)))
    lo = max(0, at - 12)
    got, want = text[lo : at + 20], ref[lo : at + 20]
    return f"differs at char {at} ({len(text)} vs {len(ref)} chars): got {got!r}, want {want!r}"
