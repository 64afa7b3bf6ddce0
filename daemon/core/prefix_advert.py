"""What a board advertises of the prefixes its KV lanes hold (observe.proto `PrefixBlocks`).

Each lane that holds trusted KV (parked, or owned by a running sequence) is a chain of block hashes
(`calculet.common.prefix`): hash i names the lane's first (i + 1) * 64 tokens. A router looks up a
prompt's chain in the union of these sets; the longest run from block 0 it finds is what the board
holds of that prompt.

Each chain's last hash is its lane's *tip*, sent beside the set (one per lane, never left out): a
prompt that matches through a tip continues that lane, which the daemon reuses first
(`prefix_match.py`); a shorter shared prefix is reused only when no lane is FREE.

The report is bounded (`MAX_ADVERTISED_BLOCKS`). When the lanes hold more distinct blocks, the set
is filled breadth-first: every lane's block 0, then every lane's block 1, and so on. So each lane's
advertised blocks stay a prefix of its chain and a match is never claimed beyond what was sent;
only the deepest blocks of the longest lanes are left out.
"""

from __future__ import annotations

from collections.abc import Sequence

from calculet.common.prefix import MAX_ADVERTISED_BLOCKS


def tips(chains: Sequence[Sequence[int]]) -> tuple[int, ...]:
    """The distinct last hashes of the non-empty chains (the lanes' tips), in chain order."""
    return tuple(dict.fromkeys(chain[-1] for chain in chains if chain))


def advertise(chains: Sequence[Sequence[int]], limit: int = MAX_ADVERTISED_BLOCKS) -> tuple[tuple[int, ...], bool]:
    """The distinct block hashes of `chains`, at most `limit` of them, shallowest blocks first.

    Returns:
        (hashes in the order they were taken, whether any block was left out).
    """
    taken: dict[int, None] = {}  # insertion-ordered set
    depth = max((len(c) for c in chains), default=0)
    for d in range(depth):
        for chain in chains:
            if d < len(chain) and chain[d] not in taken:
                if len(taken) >= limit:
                    return tuple(taken), True
                taken[chain[d]] = None
    return tuple(taken), False
