"""Constrained decoding with llguidance (docs/daemon.md "Constrained decoding").

Public API: `GrammarCompiler` (compiler.py: one per model generation, compiles each constraint once,
LRU-bounded) and `GrammarMatcher` (matcher.py: one per constrained sequence, owned by it: the
allowed-token mask for the next step, and the tokens consumed so far).
"""

from calculet.daemon.grammar.compiler import DEFAULT_CACHE_SIZE, GrammarCompiler
from calculet.daemon.grammar.matcher import GrammarMatcher

__all__ = ["DEFAULT_CACHE_SIZE", "GrammarCompiler", "GrammarMatcher"]
