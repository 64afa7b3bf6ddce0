"""Argument checks shared by every calsim kernel, run before any KV is touched.

Kernels call `check_prefill` / `check_decode` first; on success they get normalised int64 arrays
and can write KV knowing the whole call is valid (a refused call leaves every lane unchanged).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from calculet.daemon.calsim.kernel import DecodeRow
from calculet.daemon.calsim.kernels.errors import KernelInputError


@dataclass(frozen=True)
class Bounds:
    """The limits a kernel enforces: token ids < vocab, lane ids < lanes, KV slots < lane_context."""

    vocab_size: int
    lanes: int
    lane_context: int


@dataclass(frozen=True)
class DecodeBatch:
    """Validated decode rows as parallel int64 arrays of length B (row order kept)."""

    lanes: np.ndarray
    past: np.ndarray
    tokens: np.ndarray
    positions: np.ndarray

    def __len__(self) -> int:
        return int(self.lanes.shape[0])


def _check_lane(bounds: Bounds, lane: int, where: str) -> None:
    if not 0 <= lane < bounds.lanes:
        raise KernelInputError(f"{where}: lane {lane} out of range (kernel has lanes 0..{bounds.lanes - 1})")


def _check_span(bounds: Bounds, past_kv_len: int, n: int, where: str) -> None:
    if past_kv_len < 0:
        raise KernelInputError(f"{where}: past_kv_len {past_kv_len} is negative")
    if past_kv_len + n > bounds.lane_context:
        raise KernelInputError(
            f"{where}: past_kv_len {past_kv_len} + {n} new tokens exceeds lane_context {bounds.lane_context}"
        )


def _int_vector(values: np.ndarray, name: str, where: str) -> np.ndarray:
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise KernelInputError(f"{where}: {name} must be 1-D, got shape {arr.shape}")
    if arr.dtype.kind not in "iu":
        raise KernelInputError(f"{where}: {name} must be integers, got dtype {arr.dtype}")
    return arr.astype(np.int64, copy=False)


def _check_tokens(bounds: Bounds, tokens: np.ndarray, where: str) -> None:
    bad = (tokens < 0) | (tokens >= bounds.vocab_size)
    if bad.any():
        first = int(tokens[np.argmax(bad)])
        raise KernelInputError(f"{where}: token id {first} out of range [0, {bounds.vocab_size})")


def _check_positions(positions: np.ndarray, where: str) -> None:
    if (positions < 0).any():
        raise KernelInputError(f"{where}: position {int(positions.min())} is negative")


def check_prefill(
    bounds: Bounds, lane: int, past_kv_len: int, tokens: np.ndarray, positions: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Validate one prefill call.

    Returns:
        (tokens, positions) as int64 [n].

    Raises:
        KernelInputError: lane out of range, tokens/positions not 1-D integers of equal length,
            empty tokens, token id outside the vocab, negative position or past_kv_len,
            or past_kv_len + n > lane_context.
    """
    where = "prefill"
    _check_lane(bounds, lane, where)
    tok = _int_vector(tokens, "tokens", where)
    pos = _int_vector(positions, "positions", where)
    if tok.shape[0] == 0:
        raise KernelInputError(f"{where}: tokens is empty (need at least one token)")
    if pos.shape != tok.shape:
        raise KernelInputError(f"{where}: {pos.shape[0]} positions for {tok.shape[0]} tokens")
    _check_span(bounds, past_kv_len, tok.shape[0], where)
    _check_tokens(bounds, tok, where)
    _check_positions(pos, where)
    return tok, pos


def check_decode(bounds: Bounds, rows: Sequence[DecodeRow]) -> DecodeBatch:
    """Validate one decode call.

    Returns:
        the rows as a `DecodeBatch`.

    Raises:
        KernelInputError: no rows, a lane out of range or repeated, a token id outside the vocab,
            a negative position or past_kv_len, or past_kv_len + 1 > lane_context.
    """
    if len(rows) == 0:
        raise KernelInputError("decode: no rows (need at least one)")
    seen: set[int] = set()
    for i, row in enumerate(rows):
        where = f"decode row {i}"
        _check_lane(bounds, row.lane, where)
        if row.lane in seen:
            raise KernelInputError(f"{where}: lane {row.lane} repeated (rows must be on distinct lanes)")
        seen.add(row.lane)
        _check_span(bounds, row.past_kv_len, 1, where)
        if not 0 <= row.token < bounds.vocab_size:
            raise KernelInputError(f"{where}: token id {row.token} out of range [0, {bounds.vocab_size})")
        if row.position < 0:
            raise KernelInputError(f"{where}: position {row.position} is negative")
    return DecodeBatch(
        lanes=np.fromiter((r.lane for r in rows), dtype=np.int64, count=len(rows)),
        past=np.fromiter((r.past_kv_len for r in rows), dtype=np.int64, count=len(rows)),
        tokens=np.fromiter((r.token for r in rows), dtype=np.int64, count=len(rows)),
        positions=np.fromiter((r.position for r in rows), dtype=np.int64, count=len(rows)),
    )


def check_lane(bounds: Bounds, lane: int, where: str) -> None:
    """Raises KernelInputError if `lane` is not one of the kernel's lanes."""
    _check_lane(bounds, lane, where)
