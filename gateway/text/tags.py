"""Finding a tag in text that arrives in pieces, without ever emitting part of it as text."""

from __future__ import annotations


def held_tail(text: str, tag: str) -> int:
    """How many characters at the end of `text` could begin `tag` (to hold back until the next
    piece tells whether the tag follows).

    Args:
        text: what has arrived and holds no complete `tag`.
        tag: the tag looked for.
    Returns:
        The length of the longest suffix of `text` that is a proper prefix of `tag` (0: none).
    """
    for n in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0
