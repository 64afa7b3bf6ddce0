"""A generation's token history in the shape penalties need, kept up to date in O(1) per token.

Repetition penalty needs the distinct ids of prompt + output; presence and frequency penalties
need the distinct generated ids with their counts. Rebuilding either from the raw token lists
every step would cost O(prompt + output) Python work per token, so `TokenHistory` keeps both as
growing numpy arrays (amortised doubling) plus a dict from id to slot. The sampler gathers and
scatters through these arrays, which is O(distinct tokens seen) numpy work and no Python loop.

Ownership: the generation (the daemon's sequence) owns its history and appends each token it
accepts; the `Sampler` only reads it, and only during `sample()`. After a failover the resumed
tokens are passed as `generated`, so they count as output for the penalties, as they did before.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable, Sequence

import numpy as np

from calculet.common.errors import InvalidArgument

_INITIAL_CAPACITY = 64


class _GrowingIds:
    """Append-only intp array with amortised doubling; `view()` is the filled prefix."""

    def __init__(self, initial: np.ndarray) -> None:
        self._buf = np.empty(max(_INITIAL_CAPACITY, 2 * len(initial)), dtype=np.intp)
        self._buf[: len(initial)] = initial
        self._n = len(initial)

    def append(self, value: int) -> int:
        if self._n == len(self._buf):
            grown = np.empty(2 * len(self._buf), dtype=np.intp)
            grown[: self._n] = self._buf[: self._n]
            self._buf = grown
        self._buf[self._n] = value
        self._n += 1
        return self._n - 1

    def increment(self, slot: int) -> None:
        self._buf[slot] += 1

    def view(self) -> np.ndarray:
        v = self._buf[: self._n]
        v.flags.writeable = False
        return v


class TokenHistory:
    """Distinct seen ids (prompt + output) and generated-token counts of one generation.

    Args:
        vocab_size: the model's vocabulary size; every id must be in [0, vocab_size).
        prompt: prompt token ids.
        generated: completion tokens that already exist (resumed after a failover or recovery).

    Raises:
        InvalidArgument: an id is outside the vocabulary or not an integer.
    """

    def __init__(self, vocab_size: int, prompt: Sequence[int] | np.ndarray, generated: Iterable[int] = ()) -> None:
        self.vocab_size = vocab_size
        prompt_ids = np.asarray(prompt)
        if prompt_ids.size and not np.issubdtype(prompt_ids.dtype, np.integer):
            raise InvalidArgument(f"prompt: token ids must be integers, got dtype {prompt_ids.dtype}")
        prompt_ids = prompt_ids.astype(np.intp, copy=False).ravel()
        if prompt_ids.size and (prompt_ids.min() < 0 or prompt_ids.max() >= vocab_size):
            raise InvalidArgument(f"prompt: token ids must be in [0, {vocab_size})")
        unique_prompt = np.unique(prompt_ids)
        self._seen_set: set[int] = set(unique_prompt.tolist())
        self._seen = _GrowingIds(unique_prompt)
        self._gen_ids = _GrowingIds(np.empty(0, dtype=np.intp))
        self._gen_counts = _GrowingIds(np.empty(0, dtype=np.intp))
        self._gen_slot: dict[int, int] = {}
        self._generated_len = 0
        for token in generated:
            self.append(token)

    def append(self, token: int) -> None:
        """Record one generated token. O(1) amortised.

        Raises:
            InvalidArgument: the id is outside the vocabulary.
        """
        if isinstance(token, bool) or not isinstance(token, numbers.Integral) or not 0 <= token < self.vocab_size:
            raise InvalidArgument(f"token: id {token!r} outside the vocabulary [0, {self.vocab_size})")
        tok = int(token)
        slot = self._gen_slot.get(tok)
        if slot is None:
            self._gen_slot[tok] = self._gen_ids.append(tok)
            self._gen_counts.append(1)
        else:
            self._gen_counts.increment(slot)
        if tok not in self._seen_set:
            self._seen_set.add(tok)
            self._seen.append(tok)
        self._generated_len += 1

    @property
    def generated_len(self) -> int:
        return self._generated_len

    @property
    def seen_ids(self) -> np.ndarray:
        """Distinct ids of prompt + output (read-only intp view, no particular order)."""
        return self._seen.view()

    @property
    def generated_ids(self) -> np.ndarray:
        """Distinct generated ids in first-seen order (read-only intp view)."""
        return self._gen_ids.view()

    @property
    def generated_counts(self) -> np.ndarray:
        """How often each of `generated_ids` was generated (read-only intp view, same order)."""
        return self._gen_counts.view()
