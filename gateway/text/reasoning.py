"""`ReasoningSplitter`: an answer's `<think>...</think>` block, separated from its content as it
streams (docs/gateway.md "Tools and reasoning").

Qwen3 (and the calsim templates, which follow it) write their reasoning first, inside
`<think>\n...\n</think>`, then the answer after a blank line. The block counts only at the very
start of the answer, or from the start when the prompt itself ended inside an opened block (a
template that opens it in the generation prompt). The reasoning is given without the newlines
next to its tags, the content without the whitespace right after `</think>`; a block that never
closes (the answer ran out of tokens) is all reasoning. Nothing of a tag is ever emitted: text that
may begin one is held until the next piece, or the end, decides.

Ownership: one instance per choice; not thread-safe.
"""

from __future__ import annotations

from calculet.gateway.text.tags import held_tail

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
_START, _THINK, _AFTER, _CONTENT = range(4)
_PARTS = ("undecided", "reasoning", "layout", "content")


def prompt_opens_thinking(prompt: str) -> bool:
    """Whether a chat prompt ends inside an opened think block (the answer starts as reasoning)."""
    return prompt.rstrip().endswith(THINK_OPEN)


class ReasoningSplitter:
    """Splits one answer's text into reasoning and content.

    Args:
        in_think: the prompt ended inside an opened think block (`prompt_opens_thinking`).
    """

    def __init__(self, in_think: bool = False) -> None:
        self._state = _THINK if in_think else _START
        self._fresh = True  # in the block, nothing of it emitted yet (its leading newlines are dropped)
        self._held = ""

    @property
    def part(self) -> str:
        """Where the text fed so far ends: "undecided" (it may still open a think block),
        "reasoning" (inside the block), "layout" (the whitespace after its close tag) or "content"."""
        return _PARTS[self._state]

    def feed(self, text: str) -> tuple[str, str]:
        """The next piece of the answer.

        Args:
            text: the new text.
        Returns:
            (reasoning, content): what may be emitted of each now (either may be '').
        """
        reasoning, content = "", ""
        text = self._held + text
        self._held = ""
        while text:
            if self._state == _START:
                if text.startswith(THINK_OPEN):
                    self._state, text = _THINK, text[len(THINK_OPEN) :]
                elif THINK_OPEN.startswith(text):
                    self._held, text = text, ""
                else:
                    self._state = _CONTENT
            elif self._state == _THINK:
                end = text.find(THINK_CLOSE)
                if end >= 0:
                    reasoning += self._reasoning(text[:end], final=True)
                    self._state, text = _AFTER, text[end + len(THINK_CLOSE) :]
                    continue
                hold = held_tail(text, THINK_CLOSE)
                body = text[: len(text) - hold]
                kept = body.rstrip("\n")  # newlines before the close tag are not reasoning
                self._held = body[len(kept) :] + text[len(text) - hold :]
                reasoning += self._reasoning(kept, final=False)
                text = ""
            elif self._state == _AFTER:
                stripped = text.lstrip()
                if stripped:
                    self._state = _CONTENT
                text = stripped
            else:
                content, text = content + text, ""
        return reasoning, content

    def finish(self) -> tuple[str, str]:
        """The end of the answer: whatever was held, as what it turned out to be."""
        held, self._held = self._held, ""
        if self._state == _START:
            return "", held  # an answer that is a prefix of "<think>" and no more
        if self._state == _THINK:
            return self._reasoning(held.rstrip("\n"), final=True), ""
        return "", ""

    def _reasoning(self, text: str, *, final: bool) -> str:
        if self._fresh:
            text = text.lstrip("\n")
            self._fresh = not text
        return text.rstrip("\n") if final else text
