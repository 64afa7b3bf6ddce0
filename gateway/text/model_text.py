"""`ModelText`: one model package's tokenizer and chat template, as the gateway uses them.

Built from what a daemon's `GetModel` returns (`tokenizer.json` bytes, the Jinja2 chat template,
EOS/BOS ids, vocab size, context), so the gateway needs no shared filesystem. The template runs in
Jinja2's `ImmutableSandboxedEnvironment`: a package is data, and its template must not reach
Python internals. Data flow: OpenAI request -> `render_chat` (chat) or the prompt text -> `encode`
-> prompt token ids for Submit; token ids back -> `Detokenizer` (see `detokenizer.py`).
"""

from __future__ import annotations

import functools
import hashlib
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from calculet.common.errors import FailedPrecondition, InvalidArgument


@dataclass(frozen=True)
class ModelFacts:
    """The GetModel facts the gateway checks requests against.

    Attributes:
        alias: model alias.
        package_hash: identifies the package (and so the tokenizer) across boards.
        vocab_size: every token id the model emits is below it (ids past the tokenizer's own
            range are padding and decode to nothing).
        context: prompt + completion tokens one sequence may hold.
        eos_token_ids: ids that end generation (not rendered in text).
        bos_token_id: the tokenizer's BOS, if any (offered to the template as `bos_token`).
    """

    alias: str
    package_hash: str
    vocab_size: int
    context: int
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None = None


# Template variables the gateway sets itself; `chat_template_kwargs` may not name them.
RESERVED_TEMPLATE_VARIABLES = frozenset(
    {"messages", "add_generation_prompt", "tools", "bos_token", "eos_token", "raise_exception"}
)


_TOKENIZERS: dict[str, Tokenizer] = {}  # SHA-256 of a tokenizer.json -> the one Tokenizer built from it
_TOKENIZERS_LOCK = threading.Lock()  # packages are built on threads (`PackageCatalog._build`)


def shared_tokenizer(alias: str, tokenizer_json: bytes) -> Tokenizer:
    """The tokenizer of `tokenizer_json`, built once per distinct file and shared by every package
    that ships it (models of one family do: a Qwen3 tokenizer takes some 70 MB, and a gateway that
    met a second package of the family grew by that much). Kept as long as the gateway, as the
    packages that use it are (`PackageCatalog`); a Tokenizer is only read once built.

    Raises:
        FailedPrecondition: the tokenizer does not load (a broken package).
    """
    digest = hashlib.sha256(tokenizer_json).hexdigest()
    with _TOKENIZERS_LOCK:
        tokenizer = _TOKENIZERS.get(digest)
        if tokenizer is None:
            try:
                tokenizer = Tokenizer.from_str(tokenizer_json.decode("utf-8"))
            except Exception as err:  # the Rust side raises plain Exceptions
                raise FailedPrecondition(f"model {alias!r}: its tokenizer.json does not load: {err}") from err
            _TOKENIZERS[digest] = tokenizer
        return tokenizer


def _raise_exception(message: str) -> None:
    # Templates (Hugging Face convention) call raise_exception() to refuse a conversation.
    raise InvalidArgument(f"messages: the chat template refused them: {message}")


class ModelText:
    """Tokenizer + chat template of one package.

    Args:
        facts: the model's GetModel facts.
        tokenizer_json: the package's tokenizer.json, byte for byte.
        chat_template: Jinja2 source; empty when the package has none (chat is then refused).

    Raises:
        FailedPrecondition: the tokenizer or template does not load (a broken package).
    """

    def __init__(self, facts: ModelFacts, tokenizer_json: bytes, chat_template: str) -> None:
        self.facts = facts
        self.tokenizer = shared_tokenizer(facts.alias, tokenizer_json)
        self.tokenizer_size = self.tokenizer.get_vocab_size(with_added_tokens=True)
        self._env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, autoescape=False)
        self._env.globals["raise_exception"] = _raise_exception
        self._template = None
        if chat_template:
            try:
                self._template = self._env.from_string(chat_template)
            except TemplateError as err:
                raise FailedPrecondition(f"model {facts.alias!r}: its chat template does not compile: {err}") from err
        self.bos_token = self._token_text(facts.bos_token_id)
        self.eos_token = self._token_text(facts.eos_token_ids[0] if facts.eos_token_ids else None)

    @property
    def has_chat_template(self) -> bool:
        return self._template is not None

    def encode(self, text: str) -> list[int]:
        """Token ids of `text` (special tokens written in the text are recognised, as the
        chat template relies on; no BOS/EOS added).

        The ids are `Tokenizer.encode`'s; the batch call gives them without offsets and releases
        the GIL while it runs (`encode` holds it: a long prompt tokenized on a thread stalled the
        event loop, docs/gateway.md "Bounded requests")."""
        return list(self.tokenizer.encode_batch_fast([text], add_special_tokens=False)[0].ids)

    @functools.cached_property
    def max_token_chars(self) -> int:
        """The most characters one token stands for: a text longer than `context` times this
        cannot fit the context, whatever it says. A token's string in the vocabulary is at least
        as long as the text it decodes to (byte-level BPE writes a character per byte, byte
        fallback `<0xNN>` six for one); computed once, on first use."""
        return max(1, max(map(len, self.tokenizer.get_vocab(with_added_tokens=True)), default=1))

    def render_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> str:
        """The prompt text of a conversation.

        Args:
            messages: the messages' template views (`ChatMessage.template_view`).
            add_generation_prompt: open the assistant turn the model answers in.
            tools: OpenAI's tool list, given to the template as `tools` (None: none; Hugging
                Face's convention, which templates test with `if tools`).
            template_kwargs: further template variables (the request's `chat_template_kwargs`,
                e.g. `enable_thinking`); they cannot replace the variables above.

        Returns:
            The prompt text, special tokens written as text.

        Raises:
            InvalidArgument: the package has no chat template, a kwarg names a reserved variable,
                or the template refused or failed on these messages.
        """
        if self._template is None:
            raise InvalidArgument(f"model {self.facts.alias!r} has no chat template; use /v1/completions")
        extra = dict(template_kwargs or {})
        for name in extra:
            if name in RESERVED_TEMPLATE_VARIABLES:
                raise InvalidArgument(f"chat_template_kwargs.{name}: reserved; the request's own field sets it")
        try:
            return self._template.render(
                **extra,
                messages=list(messages),
                add_generation_prompt=add_generation_prompt,
                tools=list(tools) if tools is not None else None,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
            )
        except InvalidArgument:
            raise
        except (TemplateError, TypeError, ValueError, KeyError, AttributeError) as err:
            # A sandbox violation is a SecurityError (a TemplateError); a malformed message shape
            # surfaces as one of the others. Either way the request, not the gateway, is at fault.
            raise InvalidArgument(f"messages: the chat template could not render them: {err}") from err

    def token_text(self, token: int) -> str:
        """The text of one token alone (for logprobs); '' for ids with no token."""
        if token >= self.tokenizer_size:
            return ""
        return self.tokenizer.decode([token], skip_special_tokens=False)

    def _token_text(self, token: int | None) -> str:
        if token is None or token >= self.tokenizer_size:
            return ""
        return self.tokenizer.id_to_token(token) or ""
