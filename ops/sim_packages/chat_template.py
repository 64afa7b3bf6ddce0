"""The ChatML chat templates shipped in the calsim packages, and a renderer for them.

Owns `chat_template.j2` (tiny) and `qwen_chat_template.j2` (the qwen presets), both beside this
file (the `.j2` suffix is what the distribution's package data ships); the builder copies the
preset's template verbatim to `tokenizer/chat_template.jinja`. Both render alike: ChatML with
Qwen3's conventions (content as a string or a list of OpenAI text parts; `tools`, assistant
`tool_calls`, `tool` results, `reasoning_content` and `enable_thinking`, docs/gateway.md "Tools
and reasoning"); a conversation without those renders as plain ChatML. Rendering follows Hugging
Face's convention (sandboxed Jinja2, `trim_blocks` and `lstrip_blocks`, variables `messages`,
`add_generation_prompt`, `tools` and the chat template kwargs), so the gateway's renderer and
this one agree on the text. The builder uses `render_chat` for the golden prompt.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from importlib import resources
from typing import Any

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from calculet.common.errors import InvalidArgument

TEMPLATE_RESOURCE = "chat_template.j2"
QWEN_TEMPLATE_RESOURCE = "qwen_chat_template.j2"


def load_chat_template(resource: str = TEMPLATE_RESOURCE) -> str:
    """A template's source text, exactly as packages ship it.

    Args:
        resource: the file name beside this module (`TEMPLATE_RESOURCE` or `QWEN_TEMPLATE_RESOURCE`).

    Returns:
        The Jinja2 source.
    """
    return resources.files(__package__).joinpath(resource).read_text(encoding="utf-8")


def render_chat(
    template: str,
    messages: Sequence[Mapping[str, Any]],
    *,
    add_generation_prompt: bool,
    tools: Sequence[Mapping[str, Any]] | None = None,
    **template_kwargs: Any,
) -> str:
    """Render `messages` through `template`.

    Args:
        template: Jinja2 source (e.g. from `load_chat_template()`).
        messages: each with string `role` and a `content` that is a string (or null beside
            `tool_calls`).
        add_generation_prompt: append the assistant header so the model continues as assistant.
        tools: OpenAI's tool list (None: no tools).
        template_kwargs: further template variables (e.g. `enable_thinking`).

    Returns:
        The prompt text, special tokens included as text.

    Raises:
        InvalidArgument: a message lacks `role` or `content`, or the template fails to render.
    """
    for i, m in enumerate(messages):
        content = m.get("content")
        if not isinstance(m.get("role"), str) or not (
            isinstance(content, str) or ("content" in m and content is None and m.get("tool_calls"))
        ):
            raise InvalidArgument(f"messages[{i}]: needs string 'role' and 'content'")
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    try:
        return env.from_string(template).render(
            **template_kwargs,
            messages=[dict(m) for m in messages],
            add_generation_prompt=add_generation_prompt,
            tools=tools,
        )
    except TemplateError as exc:
        raise InvalidArgument(f"chat template failed to render: {exc}") from exc
