"""One constrained sequence's grammar state: llguidance's matcher over the tokens it has so far.

Ownership: the `ClientJob` owns its `GrammarMatcher` (made by `GrammarCompiler.matcher`, a copy of the
compiled template, so no two sequences share state). Like the sequence's tokens it changes only
where they change: `consume` when the engine accepts a token (under its lock), and it is read by the
completion thread while a device job carries the sequence (`allowed`, `would_stop`, `forced_after`),
when nothing else touches it. Not thread-safe by itself.

Lifecycle (`MatcherState`): ACTIVE while tokens may follow; STOPPED once the grammar is complete and
nothing may follow (the sequence ends STOP); FAILED if llguidance reports an error (a bug, not a
client's: every consumed token came from the mask), after which it allows nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum, auto
from typing import TYPE_CHECKING

import numpy as np

from calculet.common.errors import InvalidArgument
from calculet.common.lifecycle import Lifecycle, table

if TYPE_CHECKING:  # imported for real by the compiler that made the matcher (`compiler.py`)
    import llguidance


class MatcherState(Enum):
    ACTIVE = auto()
    STOPPED = auto()
    FAILED = auto()


@dataclass(frozen=True)
class ForcedRun:
    """Tokens the grammar forces one after another (each the only token its mask allows).

    Attributes:
        tokens: the run, in order (empty: the next token is not forced).
        completes: its last token completes the grammar (nothing may follow it).
    """

    tokens: tuple[int, ...] = ()
    completes: bool = False


NO_RUN = ForcedRun()


MATCHER_TRANSITIONS = table(
    [
        (MatcherState.ACTIVE, [MatcherState.STOPPED, MatcherState.FAILED]),
    ]
)


class GrammarMatcher:
    """The constraint's state for one sequence.

    Args:
        matcher: a fresh llguidance matcher of the compiled grammar (this object owns it).
        vocab_size: the model's vocabulary (the mask's width; ids past the tokenizer's are never allowed).
        field: the constraint's field name, for error messages (e.g. `constraint.json_schema`).
    """

    def __init__(self, matcher: llguidance.LLMatcher, vocab_size: int, field: str) -> None:
        self._m = matcher
        self.vocab_size = vocab_size
        self.field = field
        from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask

        self._fill = fill_next_token_bitmask
        self._bits = allocate_token_bitmask(1, vocab_size)
        self.lifecycle: Lifecycle[MatcherState] = Lifecycle(
            f"matcher {field}", MatcherState.ACTIVE, MATCHER_TRANSITIONS
        )
        self._sync()

    @property
    def state(self) -> MatcherState:
        return self.lifecycle.state

    @property
    def error(self) -> str:
        """llguidance's error message (empty unless FAILED)."""
        return self._m.get_error() if self._m.is_error() else ""

    def replay(self, tokens: Sequence[int], first_index: int = 0) -> None:
        """Consume the tokens an earlier attempt produced (a resumed request), checking each.
        `first_index`: the index of `tokens[0]` in `resume_tokens` (a thinking request's matcher
        replays only the answer after its think block), for the messages.

        Raises:
            InvalidArgument: `resume_tokens[i]` is not allowed there, or the grammar was already
                complete before the last one (the earlier attempt would have stopped).
        """
        ok = self._m.validate_tokens(list(tokens))
        if ok < len(tokens):
            raise InvalidArgument(
                f"resume_tokens[{first_index + ok}]: {tokens[ok]} is not allowed by the {self.field} constraint"
            )
        for i, token in enumerate(tokens):
            if self.state is MatcherState.STOPPED:
                raise InvalidArgument(
                    f"resume_tokens[{first_index + i}]: the {self.field} constraint was complete before it, so the "
                    "earlier attempt had already finished"
                )
            self.consume(token)
        if tokens and self.state is MatcherState.STOPPED:
            raise InvalidArgument(
                f"resume_tokens: complete the {self.field} constraint, so the earlier attempt had already finished"
            )

    def allowed(self) -> np.ndarray:
        """bool [vocab_size]: the tokens allowed next (a fresh array; EOS when the grammar accepts).

        An ACTIVE matcher always allows some token; a FAILED one allows none (the caller ends the
        sequence instead of asking).
        """
        self._fill(self._m, self._bits)
        unpacked = np.unpackbits(self._bits[0].view(np.uint8), count=self.vocab_size, bitorder="little")
        return unpacked.view(np.bool_)  # 0/1 bytes: a bool array without a copy

    def consume(self, token: int) -> None:
        """Advance past an accepted token (one the mask allowed; any other makes it FAILED)."""
        self._m.consume_token(token)
        self._sync()

    def would_stop(self, token: int) -> bool:
        """Whether accepting `token` completes the grammar (nothing may follow), without changing
        the state: consumed, checked, rolled back."""
        if not self._m.consume_token(token):
            self._sync()
            return False
        stopped = self._m.is_stopped()
        self._m.rollback(1)
        self._sync()
        return stopped

    def forced_after(self, token: int, limit: int) -> ForcedRun:
        """The run the grammar forces after `token` (one its mask allows now): each next token while
        the mask allows exactly one, at most `limit` of them, ending after one that completes the
        grammar. These are the tokens a step-by-step run must draw (a one-token mask leaves the draw
        no choice), so jump-forward may append them without decoding them. Consumed, read and rolled
        back: the state is unchanged (a token the matcher refuses leaves it FAILED, as in `would_stop`).
        """
        if limit < 1 or self.state is not MatcherState.ACTIVE:
            return NO_RUN
        if not self._m.consume_token(token):
            self._sync()
            return NO_RUN
        run: list[int] = []
        completes = False
        while len(run) < limit and not self._m.is_stopped():
            only = self._only_allowed()
            if only is None or not self._m.consume_token(only):
                break
            run.append(only)
            completes = self._m.is_stopped()
        self._m.rollback(1 + len(run))
        self._sync()
        return ForcedRun(tuple(run), completes) if self.state is MatcherState.ACTIVE else NO_RUN

    def _only_allowed(self) -> int | None:
        """The one token the mask allows now, or None when it allows several (or none). Counted on
        the packed mask, without unpacking the vocabulary."""
        self._fill(self._m, self._bits)
        words = self._bits[0].view(np.uint32)
        if int(np.bitwise_count(words).sum()) != 1:
            return None
        word = int(np.flatnonzero(words)[0])
        token = word * 32 + int(words[word]).bit_length() - 1
        return token if token < self.vocab_size else None

    def _sync(self) -> None:
        target = (
            MatcherState.FAILED
            if self._m.is_error()
            else MatcherState.STOPPED
            if self._m.is_stopped()
            else MatcherState.ACTIVE
        )
        if target is not self.state:
            self.lifecycle.move(target)
