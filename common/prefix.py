"""Chained token-block hashes: how a daemon advertises the prefixes its KV lanes hold and how a
router finds the board holding the longest prefix of a prompt (observe.proto `PrefixBlocks`).

Block i of a token sequence covers tokens [i * BLOCK_TOKENS, (i + 1) * BLOCK_TOKENS); only full
blocks are hashed. Its hash is the first 8 bytes (big-endian) of BLAKE2b over the previous
block's hash (8 bytes big-endian, 0 before block 0) and the block's token ids as little-endian
uint32, as vLLM's block hashes chain: a hash names the whole prefix up to its block's end, so two
sequences share block i's hash only if they share every token before it.

Pure functions with no dependency beyond the standard library: the daemon (which advertises) and
the gateway (which matches) import the same code, so their hashes agree by construction.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Collection, Sequence

BLOCK_TOKENS = 64
"""Tokens per block, fixed by the protocol (PrefixBlocks.block_tokens)."""
MAX_ADVERTISED_BLOCKS = 4096
"""At most this many hashes per model in one load report (32 KiB)."""


def block_hash(prev: int, block: Sequence[int]) -> int:
    """The chained hash of one full block after the block whose hash is `prev` (0 for block 0)."""
    digest = hashlib.blake2b(prev.to_bytes(8, "big"), digest_size=8)
    digest.update(struct.pack(f"<{len(block)}I", *block))
    return int.from_bytes(digest.digest(), "big")


def block_hashes(tokens: Sequence[int], *, start: int = 0, prev: int = 0) -> list[int]:
    """Chained hashes of the full blocks of `tokens`, from block `start` on.

    Args:
        tokens: the whole token sequence (block `start` begins at `start * BLOCK_TOKENS`).
        start: the first block to hash (the ones before are already known).
        prev: the hash of block `start - 1` (0 when `start` is 0).

    Returns:
        One hash per full block from `start`, in order.
    """
    hashes: list[int] = []
    for begin in range(start * BLOCK_TOKENS, len(tokens) - BLOCK_TOKENS + 1, BLOCK_TOKENS):
        prev = block_hash(prev, tokens[begin : begin + BLOCK_TOKENS])
        hashes.append(prev)
    return hashes


def cached_blocks(prompt_hashes: Sequence[int], held: Collection[int]) -> int:
    """How many of a prompt's blocks, from block 0, a board holds: the length of the longest run
    of `prompt_hashes` that are all in `held` (chaining makes a later hit without the earlier ones
    impossible for real lanes, so the run is the cached prefix)."""
    for i, h in enumerate(prompt_hashes):
        if h not in held:
            return i
    return len(prompt_hashes)


__all__ = ["BLOCK_TOKENS", "MAX_ADVERTISED_BLOCKS", "block_hash", "block_hashes", "cached_blocks"]
