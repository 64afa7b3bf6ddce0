"""`Detokenizer`: turns a growing list of token ids into text deltas, never half a character.

Byte-level BPE tokens are byte strings: one UTF-8 character may span several tokens, so decoding
tokens one by one would emit broken characters. This follows vLLM's incremental scheme: decode a
short window of recent tokens twice (without and with the new ones) and emit the difference only
when it does not end in U+FFFD (an incomplete character). Ids the tokenizer does not know
(padding ids between the tokenizer's size and the model's vocab) decode to nothing; special
tokens (EOS, ChatML markers) are not rendered. A byte sequence that is really invalid is emitted
as U+FFFD once a later token shows it will not complete, or by `flush()` at the end.

Cost: one tokenizer decode per streamed token, not two. The window's start moves in jumps (once it
lags the read offset by `2 * WINDOW_TOKENS`, it moves to `WINDOW_TOKENS` behind it), so the text
the window decoded to last time ("after") is, as a rule, the next call's "before", and is reused.

Ownership: one instance per generated sequence (one choice); not thread-safe.
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Tokenizer

REPLACEMENT = "\ufffd"
# Tokens kept before the read offset so a window starts on a character boundary in practice.
WINDOW_TOKENS = 6


class Detokenizer:
    """Incremental decoder of one sequence.

    Args:
        tokenizer: the model's tokenizer.
        tokenizer_size: ids at or above this decode to nothing.
    """

    def __init__(self, tokenizer: Tokenizer, tokenizer_size: int) -> None:
        self._tokenizer = tokenizer
        self._size = tokenizer_size
        self._ids: list[int] = []
        self._prefix = 0  # start of the decode window
        self._read = 0  # tokens up to here have been emitted as text
        self._last: tuple[int, int, str] = (0, 0, "")  # (start, end, text) of the last window decoded

    def add(self, tokens: Iterable[int]) -> str:
        """Append tokens; return the text that is now complete (possibly '')."""
        self._ids.extend(t for t in tokens if 0 <= t < self._size)
        return self._advance(final=False)

    def flush(self) -> str:
        """The text still held back (an incomplete character at the very end), as is."""
        return self._advance(final=True)

    def _decode(self, start: int, end: int) -> str:
        """The text of ids[start:end]; the last window's text is reused when asked again."""
        if self._last[:2] == (start, end):
            return self._last[2]
        ids = self._ids[start:end]
        text = self._tokenizer.decode(ids, skip_special_tokens=True) if ids else ""
        self._last = (start, end, text)
        return text

    def _advance(self, *, final: bool) -> str:
        if self._read == len(self._ids):
            return ""
        before = self._decode(self._prefix, self._read)
        after = self._decode(self._prefix, len(self._ids))
        if not final and (len(after) <= len(before) or after.endswith(REPLACEMENT)):
            # Nothing new, or the tail is an incomplete character: wait for the next token. (A
            # new token that decodes to nothing, e.g. a special one, is simply consumed later.)
            if len(after) == len(before) and not after.endswith(REPLACEMENT):
                self._read = len(self._ids)
            return ""
        delta = after[len(before) :]
        self._read = len(self._ids)
        if self._read - self._prefix >= 2 * WINDOW_TOKENS:
            self._prefix = self._read - WINDOW_TOKENS
        return delta
