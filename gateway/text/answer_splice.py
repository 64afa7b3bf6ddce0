"""Splicing remembered answer ids into a chat prompt, so a conversation's next turn starts with
exactly the tokens its board's parked lane holds.

At generation time the prompt ended right before the answer and the answer's ids came from the
model. So the next turn's prompt is rebuilt the same way: each remembered assistant message
(`AnswerMemory`) is replaced by a placeholder, the template is rendered, the rendered text is split
at the placeholders, each text segment is encoded on its own and the remembered ids go where the
placeholders were. The result starts with the previous prompt's ids (as the previous request encoded
them) followed by the answer's ids: the whole lane.

A placeholder is `PLACEHOLDER_OPEN + str(message index) + PLACEHOLDER_CLOSE`: two code points of
Unicode's Supplementary Private Use Area-A around decimal digits, no whitespace, so templates that
only concatenate content pass it through unchanged. The splice is refused (None: the caller encodes
the plain rendering, as without the memory) unless each placeholder appears exactly once and the
placeholder rendering, with each placeholder replaced by its message's content, is exactly the
plain rendering: a template that transforms content (strips it, drops a reasoning block, renders
it twice) is never spliced, so the spliced prompt always stands for the text the template meant.

Data flow: `GatewayService` (its chat preparation) renders the plain prompt, recalls the answers
and calls `splice_chat`; `SplicedChat.encode` gives the prompt's ids. Pure functions over a
`ModelText`: no request state is kept here or in `ModelText`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from calculet.common.errors import InvalidArgument
from calculet.gateway.text.model_text import ModelText

PLACEHOLDER_OPEN = "\U000f0000"
PLACEHOLDER_CLOSE = "\U000f0001"


def placeholder(index: int) -> str:
    """The placeholder of message `index`."""
    return f"{PLACEHOLDER_OPEN}{index}{PLACEHOLDER_CLOSE}"


@dataclass(frozen=True)
class SplicedChat:
    """A chat prompt as text segments and remembered ids, in prompt order.

    Attributes:
        pieces: a `str` is a rendered segment to encode on its own; a sequence of ints is a
            remembered answer's ids, taken as they are.
        spliced: how many assistant messages were replaced by their remembered ids.
    """

    pieces: tuple[str | Sequence[int], ...]
    spliced: int

    @property
    def text_chars(self) -> int:
        """Characters to encode (to decide whether encoding belongs off the event loop)."""
        return sum(len(piece) for piece in self.pieces if isinstance(piece, str))

    def encode(self, text: ModelText) -> list[int]:
        """The prompt's ids: each segment encoded alone, the remembered ids in between.

        Args:
            text: the package's text (the one whose answers were recalled).
        Returns:
            The token ids.
        """
        ids: list[int] = []
        for piece in self.pieces:
            ids.extend(text.encode(piece) if isinstance(piece, str) else piece)
        return ids


def splice_chat(
    text: ModelText,
    messages: Sequence[Mapping[str, Any]],
    add_generation_prompt: bool,
    answers: Mapping[int, Sequence[int]],
    rendered: str,
    *,
    tools: Sequence[Mapping[str, Any]] | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
) -> SplicedChat | None:
    """The prompt of `messages` with the remembered answers' ids in place of their text.

    Args:
        text: the package's tokenizer and template.
        messages: the template views of the request's messages (as `render_chat` takes them).
        add_generation_prompt: as the request asks.
        answers: message index -> the ids remembered for that assistant message's content.
        rendered: the plain rendering of `messages` (`text.render_chat`), to check the splice
            against.
        tools / template_kwargs: as `rendered` was rendered with them.
    Returns:
        The spliced prompt, or None when the template does not pass the placeholders through
        unchanged (then the plain rendering is encoded as a whole).
    Raises:
        Nothing of its own: a template that refuses the placeholder rendering means None.
    """
    if not answers:
        return None
    views = [{**message, "content": placeholder(i)} if i in answers else message for i, message in enumerate(messages)]
    try:
        with_placeholders = text.render_chat(
            views, add_generation_prompt=add_generation_prompt, tools=tools, template_kwargs=template_kwargs
        )
    except InvalidArgument:
        return None  # the template judged the placeholders, not the content: not ours to splice
    found: list[tuple[int, int]] = []  # (position in the rendering, message index)
    for i in answers:
        mark = placeholder(i)
        if with_placeholders.count(mark) != 1:
            return None
        found.append((with_placeholders.index(mark), i))
    found.sort()
    pieces: list[str | Sequence[int]] = []
    plain: list[str] = []
    start = 0
    for position, i in found:
        segment = with_placeholders[start:position]
        pieces += [segment, answers[i]]
        plain += [segment, str(messages[i]["content"])]
        start = position + len(placeholder(i))
    pieces.append(with_placeholders[start:])
    plain.append(with_placeholders[start:])
    if "".join(plain) != rendered:
        return None
    return SplicedChat(tuple(pieces), len(found))
