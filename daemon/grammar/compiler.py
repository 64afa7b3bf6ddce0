"""Compiling constraints against one package's tokenizer, once each, in a bounded LRU cache.

A `GrammarCompiler` belongs to one model generation (`ModelRuntime.grammar`): its llguidance
tokenizer is built from the package's own `tokenizer.json` with the model's vocabulary size (ids
past the tokenizer's never appear in a mask) and the package's EOS ids, on the first constrained
request (about 1 s for a 150k vocabulary; never for a board that serves none). Each distinct
`Constraint` is compiled once (`LLMatcher` on the grammar: its lexer and parser tables) and kept as
a template; every sequence gets its own copy (`deep_copy`, under a microsecond). The cache holds at
most `capacity` grammars and drops the least recently used. A grammar llguidance refuses raises
`InvalidArgument` naming the constraint's field, and nothing is cached for it.

Thread safety: Submit calls reach `matcher` from several transport threads at once, outside the
engine lock; one lock serialises the cache (a compile of a grammar not yet cached runs under it, so
two identical first requests compile once).
"""

from __future__ import annotations

import importlib
import json
import threading
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from calculet.common.errors import FailedPrecondition, InvalidArgument
from calculet.daemon.grammar.matcher import GrammarMatcher
from calculet.daemon.sampling.constraint import Constraint, ConstraintKind

if TYPE_CHECKING:
    import llguidance
    from llguidance._lib import JsonCompileOptions

DEFAULT_CACHE_SIZE = 64
ANY_OBJECT_SCHEMA = '{"type": "object"}'
# Compact JSON (no whitespace between tokens) unless the schema's `x-guidance` asks otherwise: a
# model is never steered into runs of whitespace, and the output is one canonical layout.
JSON_OPTIONS: JsonCompileOptions = {"whitespace_flexible": False}


def _llguidance() -> Any:
    """llguidance, imported on the first compile: a board that serves no constraint never pays its
    import (about 40 ms of a daemon start)."""
    return importlib.import_module("llguidance")


class GrammarCompiler:
    """Compiles constraints for one package (module docstring).

    Args:
        tokenizer_json: path of the package's `tokenizer.json`.
        vocab_size: the model's vocabulary size (>= the tokenizer's).
        eos_ids: the package's EOS token ids (allowed when the grammar accepts).
        capacity: compiled grammars kept (>= 1).
    """

    def __init__(
        self, tokenizer_json: Path, vocab_size: int, eos_ids: tuple[int, ...], capacity: int = DEFAULT_CACHE_SIZE
    ) -> None:
        if capacity < 1:
            raise InvalidArgument(f"capacity: must be positive, got {capacity}")
        self.tokenizer_json = tokenizer_json
        self.vocab_size = vocab_size
        self.eos_ids = eos_ids
        self.capacity = capacity
        self.compiles = 0  # grammars compiled (cache misses that succeeded or failed)
        self._lock = threading.Lock()
        self._tokenizer: llguidance.LLTokenizer | None = None
        self._cache: OrderedDict[Constraint, llguidance.LLMatcher] = OrderedDict()

    def __len__(self) -> int:
        with self._lock:
            return len(self._cache)

    def matcher(self, constraint: Constraint) -> GrammarMatcher:
        """A fresh matcher of `constraint` (compiled now unless cached).

        Raises:
            InvalidArgument: llguidance refuses the schema, regex or grammar; the message starts
                with the constraint's field (e.g. `constraint.regex: ...`).
            FailedPrecondition: the package's tokenizer cannot be read (a package fault).
        """
        with self._lock:
            template = self._cache.get(constraint)
            if template is None:
                template = self._compile(constraint)
                self._cache[constraint] = template
                if len(self._cache) > self.capacity:
                    self._cache.popitem(last=False)
            else:
                self._cache.move_to_end(constraint)
            copy = template.deep_copy()
        return GrammarMatcher(copy, self.vocab_size, constraint.field)

    def _compile(self, constraint: Constraint) -> llguidance.LLMatcher:
        self.compiles += 1
        tokenizer = self._tokenizer_locked()
        try:
            grammar = grammar_text(constraint)
        except (ValueError, TypeError) as exc:  # llguidance's own refusal of the source text
            raise InvalidArgument(f"{constraint.field}: {exc}") from None
        lib = _llguidance()
        problem = lib.LLMatcher.validate_grammar(grammar, tokenizer)
        if problem:
            raise InvalidArgument(f"{constraint.field}: {problem.strip()}")
        matcher: llguidance.LLMatcher = lib.LLMatcher(tokenizer, grammar)
        if matcher.is_error():
            raise InvalidArgument(f"{constraint.field}: {matcher.get_error().strip()}")
        return matcher

    def _tokenizer_locked(self) -> llguidance.LLTokenizer:
        if self._tokenizer is None:
            try:
                text = self.tokenizer_json.read_text(encoding="utf-8")
                self._tokenizer = _llguidance().LLTokenizer(text, n_vocab=self.vocab_size, eos_token=list(self.eos_ids))
            except (OSError, ValueError, RuntimeError) as exc:
                raise FailedPrecondition(f"the package's tokenizer {self.tokenizer_json.name}: {exc}") from None
        return self._tokenizer


def grammar_text(constraint: Constraint) -> str:
    """llguidance's grammar for a constraint (a choice is a Lark alternation of string literals).

    Raises:
        ValueError: llguidance cannot read the source (e.g. a JSON schema that is not JSON).
    """
    kind = constraint.kind
    matcher = _llguidance().LLMatcher
    if kind is ConstraintKind.JSON_SCHEMA:
        return str(matcher.grammar_from_json_schema(constraint.text, defaults=JSON_OPTIONS))
    if kind is ConstraintKind.JSON_OBJECT:
        return str(matcher.grammar_from_json_schema(ANY_OBJECT_SCHEMA, defaults=JSON_OPTIONS))
    if kind is ConstraintKind.REGEX:
        return str(matcher.grammar_from_regex(constraint.text))
    if kind is ConstraintKind.CHOICE:
        literals = " | ".join(json.dumps(c, ensure_ascii=False) for c in constraint.choices)
        return str(matcher.grammar_from_lark(f"start: {literals}"))
    return str(matcher.grammar_from_lark(constraint.text))
