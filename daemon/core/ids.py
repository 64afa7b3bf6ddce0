"""Identifier types shared by the core modules (one place, so signatures say what they hold)."""

from __future__ import annotations

from typing import TypeAlias

SequenceId: TypeAlias = str
"""A generation request's sequence (one prompt + its generated tokens); owns at most one KV lane."""

JobId: TypeAlias = int
"""One device job built by the executor (a prefill of one sequence or a batched decode step)."""
