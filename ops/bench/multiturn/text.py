"""Text of a given length in tokens, measured with the model's own tokenizer.

Owns `SizedText` (a text and its token count), `TokenCounter` (text -> tokens, the model's
tokenizer without special tokens) and `sized_text`: words drawn from `WORDS` with a seeded
`random.Random`, joined by single spaces, grown in steps until the counter reaches the target, cut
back word by word while above it, then topped up one fitting word at a time (a word is kept only
if the count stays at or below the target). So the result never exceeds the target (except a
`lead` that alone is longer) and is exact whenever some pool word fills the last gap, which for the
presets' tokenizers (tiny's byte-level BPE, Qwen3's) is every time in the tests: a pool word of one
token always exists. The same seed, words and tokenizer give the same text.

Data flow: `workload.build_workload` -> `sized_text(target, counter, rng, lead)` -> SizedText.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from calculet.common.errors import InvalidArgument

TokenCounter = Callable[[str], int]
"""Tokens of a text as the model's tokenizer encodes it (no special tokens added)."""

MAX_TOP_UP_TRIES = 256

# Short, common English words (no punctuation): most are one token in a byte-level BPE with a
# leading space, so they tile a budget finely. Order matters: `workload` draws leads from it.
WORDS: tuple[str, ...] = (
    "the", "of", "and", "to", "in", "is", "it", "that", "for", "on", "with", "as", "was", "at", "by",
    "be", "this", "from", "or", "an", "are", "not", "but", "all", "can", "had", "her", "one", "our",
    "out", "day", "get", "has", "him", "his", "how", "man", "new", "now", "old", "see", "two", "way",
    "who", "boy", "did", "its", "let", "put", "say", "she", "too", "use", "board", "chip", "model",
    "token", "lane", "queue", "batch", "prompt", "answer", "question", "system", "memory", "device",
    "time", "year", "people", "thing", "world", "life", "hand", "part", "child", "eye", "woman",
    "place", "work", "week", "case", "point", "number", "group", "problem", "fact", "good", "first",
    "last", "long", "great", "little", "own", "other", "right", "big", "high", "different", "small",
    "large", "next", "early", "young", "important", "few", "public", "bad", "same", "able", "make",
    "know", "take", "come", "think", "look", "want", "give", "find", "tell", "ask", "seem", "feel",
    "try", "leave", "call", "keep", "begin", "help", "show", "hear", "play", "run", "move", "live",
    "believe", "hold", "bring", "write", "stand", "lose", "pay", "meet", "include", "continue", "set",
    "learn", "change", "lead", "understand", "watch", "follow", "stop", "create", "speak", "read",
    "spend", "grow", "open", "walk", "win", "offer", "remember", "love", "consider", "appear", "buy",
    "wait", "serve", "die", "send", "expect", "build", "stay", "fall", "cut", "reach", "kill",
    "remain", "suggest", "raise", "pass", "sell", "require", "report", "decide", "pull", "river",
    "mountain", "city", "house", "water", "light", "door", "road", "tree", "book", "story", "night",
    "morning", "evening", "rain", "sun", "cloud", "sea", "fox", "dog", "robot", "library", "room",
    "table", "window", "garden", "letter", "music", "paper", "picture", "reason", "result", "idea",
    "a", "I", "so", "up", "if", "no", "we", "he", "do", "go", "me", "my", "us", "am", "yes",
)  # fmt: skip


@dataclass(frozen=True)
class SizedText:
    """A text and its length in tokens as the model's tokenizer counts it."""

    text: str
    tokens: int


def sized_text(
    target: int,
    count: TokenCounter,
    rng: random.Random,
    lead: Sequence[str] = (),
    words: Sequence[str] = WORDS,
) -> SizedText:
    """A text of about `target` tokens: `lead`, then random `words` (see the module docstring).

    Args:
        target: tokens wanted (0: the empty text, which needs no lead).
        count: the model's token counter.
        rng: the seeded generator the words are drawn from (advanced).
        lead: words the text starts with, kept whatever the target.
        words: the pool.

    Returns:
        The text and its exact token count (`count` of the text).

    Raises:
        InvalidArgument: a negative target, or an empty pool.
    """
    if target < 0:
        raise InvalidArgument(f"text length: must be >= 0 tokens, got {target}")
    if not words:
        raise InvalidArgument("text: the word pool is empty")
    if target == 0:
        return SizedText("", 0)
    chosen = list(lead)
    n = count(_join(chosen))
    while n < target:  # grow: about half a word per missing token, so it never overshoots far
        chosen += [rng.choice(words) for _ in range(max(1, (target - n) // 2))]
        n = count(_join(chosen))
    while n > target and len(chosen) > len(lead):
        chosen.pop()
        n = count(_join(chosen))
    for _ in range(MAX_TOP_UP_TRIES):
        if n >= target:
            break
        candidate = rng.choice(words)
        m = count(_join([*chosen, candidate]))
        if m <= target:
            chosen.append(candidate)
            n = m
    return SizedText(_join(chosen), n)


def _join(words: Sequence[str]) -> str:
    return " ".join(words)
