"""`AnswerMemory`: the token ids behind the chat answers this gateway returned, keyed by their text.

Why: a chat client sends the previous answer back as *text*, and encoding that text again often
does not give the ids the model produced (BPE merges differ; special and padding ids are not
rendered at all). The board's parked lane holds the produced ids, so a prompt built from the
re-encoded text stops matching it inside the previous answer. With the produced ids remembered, the
next turn's prompt can carry them instead (`answer_splice.py`) and the whole lane is reused.

Data flow: a chat choice that ends normally (`ChoiceRunner`, `serving/choice.py`) calls
`remember(package hash, the text the client got, the ids behind it)`; the next request's
preparation (`GatewayService`) calls `recall(package hash, an assistant message's content)` for each
assistant message and splices the ids it gets.

Ownership and bounds: one instance per gateway process, owned by the `GatewayService` (created from
`--answer-memory-tokens` / `answer-memory-tokens`), used only on the event loop (not thread-safe).
Entries are least recently used first out: `remember` and a successful `recall` make an entry the
newest; `remember` evicts the oldest until the ids held total at most `max_tokens`. Ids are stored
as `array('I')` (4 bytes a token); each entry also holds its key's text (a few bytes a token) and a
fixed overhead of a few hundred bytes. An answer longer than the whole bound is not kept; a bound
of 0 disables the memory (nothing is kept, every `recall` is None). Nothing survives a restart, and
gateways do not share memories: a turn that reaches another gateway is encoded from its text, as
without the memory.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Sequence

from calculet.common.errors import InvalidArgument

DEFAULT_MAX_TOKENS = 0
"""Off by default: the ids it splices make a prompt depend on this gateway's memory (another gateway,
or this one after an eviction or a restart, encodes the same request from its text), so a sampled
answer would depend on which gateway served the previous turn. Opt in where conversations stay on
one gateway (4,000,000 tokens are about 16 MB of ids plus their texts)."""

_Key = tuple[str, str]  # (package hash, answer text)


class AnswerMemory:
    """An LRU map (package hash, answer text) -> the answer's token ids, bounded in tokens.

    Args:
        max_tokens: the most token ids held at once, over all entries; 0 disables the memory.

    Raises:
        InvalidArgument: `max_tokens` is negative.
    """

    def __init__(self, max_tokens: int = DEFAULT_MAX_TOKENS) -> None:
        if max_tokens < 0:
            raise InvalidArgument(f"answer-memory-tokens: must be 0 or more, got {max_tokens}")
        self.max_tokens = max_tokens
        self._entries: OrderedDict[_Key, array[int]] = OrderedDict()  # oldest first
        self._tokens = 0

    @property
    def enabled(self) -> bool:
        """Whether anything can be remembered (a bound above 0)."""
        return self.max_tokens > 0

    @property
    def tokens(self) -> int:
        """Token ids held now, over all entries."""
        return self._tokens

    @property
    def entries(self) -> int:
        """Answers held now."""
        return len(self._entries)

    def remember(self, package_hash: str, text: str, ids: Sequence[int]) -> bool:
        """Keep `ids` as the tokens behind `text` for `package_hash`, as the newest entry (an older
        entry of the same key is replaced), then evict the oldest entries past the bound.

        Args:
            package_hash: the package whose tokenizer produced `ids`.
            text: the answer exactly as the client got it.
            ids: the token ids the model produced for it (each below 2**32).
        Returns:
            True if kept; False when disabled, `text` or `ids` is empty (an empty content is
            ambiguous: nothing tells two empty answers apart), or `ids` alone exceed the bound.
        Raises:
            OverflowError: an id is negative or not below 2**32 (not a token id).
        """
        if not text or not ids or len(ids) > self.max_tokens:
            return False
        stored = array("I", ids)
        key = (package_hash, text)
        old = self._entries.pop(key, None)
        if old is not None:
            self._tokens -= len(old)
        self._entries[key] = stored
        self._tokens += len(stored)
        while self._tokens > self.max_tokens:
            _, evicted = self._entries.popitem(last=False)
            self._tokens -= len(evicted)
        return True

    def recall(self, package_hash: str, text: str) -> Sequence[int] | None:
        """The ids remembered for `text` under `package_hash` (the entry becomes the newest).

        Args:
            package_hash: the package the request will be encoded with.
            text: an assistant message's content.
        Returns:
            The ids (the memory's own array: read, never modify), or None when not remembered.
        """
        key = (package_hash, text)
        ids = self._entries.get(key)
        if ids is not None:
            self._entries.move_to_end(key)
        return ids
