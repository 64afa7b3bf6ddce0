"""`SentPrefixes`: the prompts this gateway's finished choices left on one board, as far as it knows,
until the board's own advertisement confirms them (docs/gateway.md, "Routing", the pick-time view;
the approximate prefix index llm-d's router keeps beside its KV events).

Why: a board advertises a parked lane only in the load report after the request ends (a finish
notice within 50 ms, else the next periodic report), and a conversation's next turn, sent the moment
the answer ended, often arrives before that report. The report it sees instead was taken while the
turn ran, and its lane tip was then a block of the answer as sampled, which the next prompt
re-renders differently when the answer's text does not re-encode to the same tokens: with cold lanes
left the router counted no cached prefix on any board and sent the turn to an empty board.

What: when a choice completes on a board, the router records its prompt's block hashes (taken at
pick, `BoardClaim.blocks`) here. The board's daemon continues a parked lane whose whole prompt the
next request resends (docs/daemon.md, "Conversations"), so the prompt's last full block is the
entry's *tip*, merged into the board's advertised tips (`held`); the entry's hashes are merged into
its advertised blocks.

Lifecycle of an entry (`ENTRY_TRANSITIONS`):
    PENDING    recorded, not yet seen in an advertisement: counted until `confirm_within_s` after
               the choice ended, then dropped (a lane evicted at once, a failed park, a board that
               reset: it must not attract turns past the bound)
    CONFIRMED  an advertisement held its tip: counted while the advertisements hold it, dropped by
               the first that does not (the lane was evicted or the board dropped its parked KV)
    DROPPED    counts nothing (terminal)

An entry whose tip a newer entry's prompt contains is superseded (the daemon continued that lane:
it now holds the newer prompt) and dropped. The view is bounded by `max_blocks` block hashes in
all: the least recently recorded entries go first. A new board epoch (the board came UP again: a
restarted daemon holds nothing) empties the view.

Pure: no I/O, no event loop; the caller passes its clock's `now` and the board's epoch.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from enum import Enum

from calculet.common.lifecycle import Lifecycle, table
from calculet.common.prefix import MAX_ADVERTISED_BLOCKS

CONFIRM_WITHIN_S = 2.0
"""How long after a choice ended its board may take to advertise the parked lane before the entry is
dropped. A daemon reports a finished request within 50 ms (`load_notices.LOAD_NOTICE_MIN_GAP_S`)
and otherwise at least once a load interval (1 s by default); twice that interval survives one
late report, while a false entry (its lane evicted, its board reset) attracts turns for 2 s at most."""

MAX_SENT_BLOCKS = MAX_ADVERTISED_BLOCKS
"""Block hashes the view keeps per board, across its entries: as many as a board advertises."""


class EntryState(Enum):
    PENDING = "pending"
    CONFIRMED = "confirmed"
    DROPPED = "dropped"


ENTRY_TRANSITIONS = table(
    [
        (EntryState.PENDING, [EntryState.CONFIRMED, EntryState.DROPPED]),
        (EntryState.CONFIRMED, [EntryState.DROPPED]),
    ]
)


@dataclass
class _SentEntry:
    hashes: tuple[int, ...]  # the prompt's full blocks, from block 0; the last is the tip
    deadline: float  # PENDING past this: dropped
    life: Lifecycle[EntryState] = field(
        default_factory=lambda: Lifecycle("sent prefix", EntryState.PENDING, ENTRY_TRANSITIONS)
    )


class SentPrefixes:
    """One board's pick-time view (see the module docstring).

    Args:
        confirm_within_s: how long a PENDING entry counts after its choice ended.
        max_blocks: block hashes kept across entries (least recently recorded dropped first).
    """

    def __init__(self, confirm_within_s: float = CONFIRM_WITHIN_S, max_blocks: int = MAX_SENT_BLOCKS) -> None:
        self._confirm_within_s = confirm_within_s
        self._max_blocks = max_blocks
        self._entries: OrderedDict[int, _SentEntry] = OrderedDict()  # by tip, least recently recorded first
        self._blocks = 0
        self._epoch: int | None = None

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def blocks(self) -> int:
        """Block hashes held across the entries."""
        return self._blocks

    def state(self, tip: int) -> EntryState:
        """The state of the entry whose tip is `tip` (DROPPED when there is none)."""
        entry = self._entries.get(tip)
        return entry.life.state if entry is not None else EntryState.DROPPED

    def parked(self, hashes: Sequence[int], now: float, epoch: int) -> None:
        """A choice whose prompt had these full blocks completed on the board at `now`.

        Args:
            hashes: the prompt's block hashes from block 0 (none: nothing to record).
            now: the caller's monotonic clock, seconds.
            epoch: the board's epoch (`Board.epoch`).
        """
        self._sync(epoch)
        if not hashes:
            return
        chain = tuple(hashes[-self._max_blocks :]) if len(hashes) > self._max_blocks else tuple(hashes)
        within = set(chain)
        for tip in [t for t in self._entries if t in within]:
            self._drop(tip)  # superseded: the lane it named now holds this longer prompt
        self._entries[chain[-1]] = _SentEntry(chain, now + self._confirm_within_s)
        self._blocks += len(chain)
        while self._blocks > self._max_blocks:
            self._drop(next(iter(self._entries)))

    def held(self, advertised: AbstractSet[int], now: float, epoch: int) -> tuple[frozenset[int], frozenset[int]]:
        """What the view adds to the board's advertisement now, confirming and dropping entries.

        Args:
            advertised: the block hashes and lane tips of the board's last report.
            now: the caller's monotonic clock, seconds.
            epoch: the board's epoch.
        Returns:
            (block hashes, tips) of the entries that count: CONFIRMED ones the advertisement still
            holds and PENDING ones within their bound.
        """
        self._sync(epoch)
        hashes: set[int] = set()
        tips: set[int] = set()
        for tip, entry in list(self._entries.items()):
            if tip in advertised:
                if entry.life.state is EntryState.PENDING:
                    entry.life.move(EntryState.CONFIRMED)
            elif entry.life.state is EntryState.CONFIRMED or now >= entry.deadline:
                self._drop(tip)
                continue
            hashes.update(entry.hashes)
            tips.add(tip)
        return frozenset(hashes), frozenset(tips)

    def _sync(self, epoch: int) -> None:
        """A new epoch (the board came UP again, maybe a restarted daemon): forget every entry."""
        if epoch != self._epoch:
            for tip in list(self._entries):
                self._drop(tip)
            self._epoch = epoch

    def _drop(self, tip: int) -> None:
        entry = self._entries.pop(tip)
        entry.life.move(EntryState.DROPPED)
        self._blocks -= len(entry.hashes)
