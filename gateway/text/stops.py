"""`StopMatcher`: OpenAI `stop` strings, matched on the generated text across token boundaries.

The daemon only knows stop token ids; stop strings are the gateway's job (inference.proto,
StoppingParams). Text arrives in deltas whose boundaries fall anywhere, so a stop string may
start in one delta and end in a later one. The matcher therefore holds back the longest tail of
the text that could still be the start of a stop string, and releases it once it cannot be.
When a stop string appears, the text before it is released, the stop string and everything after
it are dropped, and the caller cancels the job (finish_reason "stop"). The cut is always before
the earliest occurrence in the whole text, whatever the delta boundaries: a stop string that
completes inside a longer one still being matched (stops "b" and "abc", text "ab") is held until
the longer one is decided.

Ownership: one instance per generated sequence (one choice); not thread-safe.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class StopResult:
    """What `feed` decided.

    Attributes:
        text: text that may be sent to the client now.
        stopped: a stop string matched; `text` ends right before it and nothing more follows.
    """

    text: str
    stopped: bool


class StopMatcher:
    """Matches `stops` (non-empty strings) on text fed in pieces.

    Args:
        stops: the request's stop strings; empty ones are ignored.
    """

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = tuple(s for s in stops if s)
        self._held = ""  # text received but not released: a possible start of a stop string
        self._stopped = False

    @property
    def active(self) -> bool:
        return bool(self._stops)

    @property
    def stopped(self) -> bool:
        return self._stopped

    def feed(self, delta: str) -> StopResult:
        """Add generated text; return what may be released.

        Raises:
            RuntimeError: fed after a stop string matched (a caller bug).
        """
        if self._stopped:
            raise RuntimeError("StopMatcher fed after it stopped")
        if not self._stops:
            return StopResult(delta, False)
        text = self._held + delta
        cut = self._first_stop(text)
        start = len(text) - self._partial_tail(text)  # where an unfinished stop string may begin
        if 0 <= cut <= start:
            self._held, self._stopped = "", True
            return StopResult(text[:cut], True)
        self._held = text[start:]
        return StopResult(text[:start], False)

    def flush(self) -> str:
        """At the end of generation: the held text, cut before a stop string it holds (then
        `stopped` becomes true)."""
        held, self._held = self._held, ""
        if self._stopped:
            return ""
        cut = self._first_stop(held)
        if cut >= 0:
            self._stopped = True
            return held[:cut]
        return held

    def _first_stop(self, text: str) -> int:
        """Start of the earliest complete stop string in `text`, or -1."""
        return min((i for i in (text.find(s) for s in self._stops) if i >= 0), default=-1)

    def _partial_tail(self, text: str) -> int:
        """Length of the longest suffix of `text` that is a proper prefix of some stop string."""
        longest = min(len(text), max(len(s) for s in self._stops) - 1)
        for size in range(longest, 0, -1):
            tail = text[-size:]
            if any(s.startswith(tail) for s in self._stops):
                return size
        return 0
