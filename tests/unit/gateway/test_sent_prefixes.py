"""`SentPrefixes`, the gateway's pick-time view of one board: an entry counts until the board confirms
it or the bound passes, a confirmed entry counts while the board advertises it, a newer prompt
supersedes the entry it continues, the view stays within its block bound, and a new board epoch
empties it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calculet.common.errors import IllegalTransition
from calculet.common.lifecycle import Lifecycle
from calculet.gateway.routing.sent_prefixes import ENTRY_TRANSITIONS, EntryState, SentPrefixes

NONE: frozenset[int] = frozenset()


def chain(start: int, length: int) -> tuple[int, ...]:
    """Distinct stand-ins for a prompt's block hashes."""
    return tuple(range(start, start + length))


def test_a_pending_entry_counts_until_its_bound_then_is_dropped() -> None:
    view = SentPrefixes(confirm_within_s=2.0)
    view.parked(chain(10, 3), now=100.0, epoch=1)
    assert view.held(NONE, now=101.9, epoch=1) == (frozenset({10, 11, 12}), frozenset({12}))
    assert view.state(12) is EntryState.PENDING
    assert view.held(NONE, now=102.0, epoch=1) == (NONE, NONE)  # never confirmed: gone at the bound
    assert view.state(12) is EntryState.DROPPED and len(view) == 0 and view.blocks == 0


def test_a_confirmed_entry_counts_while_advertised_and_goes_with_the_first_advert_without_it() -> None:
    view = SentPrefixes(confirm_within_s=2.0)
    view.parked(chain(10, 3), now=100.0, epoch=1)
    advert = frozenset({10, 11, 12, 13})  # the parked lane: the prompt, then the answer's block
    assert view.held(advert, now=100.1, epoch=1) == (frozenset({10, 11, 12}), frozenset({12}))
    assert view.state(12) is EntryState.CONFIRMED
    assert view.held(advert, now=500.0, epoch=1)[1] == {12}  # past the bound, still advertised
    assert view.held(frozenset({10, 11}), now=500.1, epoch=1) == (NONE, NONE)  # the lane was evicted
    assert view.state(12) is EntryState.DROPPED


def test_an_advert_without_a_pending_entry_does_not_drop_it_before_its_bound() -> None:
    view = SentPrefixes(confirm_within_s=2.0)
    view.parked(chain(10, 3), now=100.0, epoch=1)
    # A report taken before the lane parked (or one that crossed the finish) holds nothing of it.
    assert view.held(frozenset({99}), now=100.5, epoch=1)[1] == {12}


def test_the_next_turn_supersedes_the_entry_it_continues() -> None:
    view = SentPrefixes()
    view.parked(chain(10, 3), now=0.0, epoch=1)
    view.parked(chain(20, 2), now=0.0, epoch=1)  # another conversation
    view.parked((*chain(10, 3), 13, 14), now=1.0, epoch=1)  # turn 2 of the first
    assert view.state(12) is EntryState.DROPPED and view.state(14) is EntryState.PENDING
    assert len(view) == 2 and view.blocks == 7


def test_the_least_recently_recorded_entries_go_past_the_block_bound() -> None:
    view = SentPrefixes(max_blocks=6)
    view.parked(chain(10, 3), now=0.0, epoch=1)
    view.parked(chain(20, 3), now=0.0, epoch=1)
    view.parked(chain(30, 2), now=0.0, epoch=1)
    assert [view.state(t) for t in (12, 22, 31)] == [EntryState.DROPPED, EntryState.PENDING, EntryState.PENDING]
    assert view.blocks == 5
    view.parked(chain(40, 9), now=0.0, epoch=1)  # longer than the bound: its deepest blocks kept
    assert len(view) == 1 and view.blocks == 6 and view.state(48) is EntryState.PENDING


def test_a_new_board_epoch_empties_the_view() -> None:
    view = SentPrefixes()
    view.parked(chain(10, 3), now=0.0, epoch=1)
    assert view.held(frozenset({12}), now=0.1, epoch=1)[1] == {12}
    assert view.held(frozenset({12}), now=0.2, epoch=2) == (NONE, NONE)  # a restarted daemon: nothing
    assert len(view) == 0 and view.state(12) is EntryState.DROPPED


def test_an_empty_prompt_records_nothing() -> None:
    view = SentPrefixes()
    view.parked((), now=0.0, epoch=1)
    assert len(view) == 0 and view.held(NONE, now=0.0, epoch=1) == (NONE, NONE)


def test_entry_lifecycle_table() -> None:
    life = Lifecycle("entry", EntryState.PENDING, ENTRY_TRANSITIONS)
    life.move(EntryState.CONFIRMED)
    life.move(EntryState.DROPPED)
    assert not any(life.can_move(s) for s in EntryState)  # dropped is terminal
    with pytest.raises(IllegalTransition):
        Lifecycle("entry", EntryState.CONFIRMED, ENTRY_TRANSITIONS).move(EntryState.PENDING)


# One step of a board's life: a choice completes (its prompt: blocks start..start+length), or the
# router reads the view with an advertisement, after `dt` seconds, maybe in a new epoch.
_park = st.tuples(st.just("park"), st.integers(0, 30), st.integers(1, 8))
_read = st.tuples(st.just("read"), st.frozensets(st.integers(0, 40), max_size=12), st.just(0))
_steps = st.lists(st.tuples(st.one_of(_park, _read), st.floats(0.0, 1.5), st.booleans()), min_size=1, max_size=40)


@settings(max_examples=200, deadline=None)
@given(_steps)
def test_what_the_view_adds_is_always_advertised_or_pending_within_its_bound(steps: list) -> None:  # type: ignore[type-arg]
    bound, limit = 2.0, 12
    view = SentPrefixes(confirm_within_s=bound, max_blocks=limit)
    now, epoch = 0.0, 1
    parked_at: dict[int, tuple[float, int]] = {}  # tip -> (when recorded, epoch)
    confirmed: set[int] = set()
    gone: set[int] = set()  # confirmed, then missing from an advertisement: never counted again
    for (kind, a, b), dt, restart in steps:
        now += dt
        epoch += int(restart)
        if kind == "park":
            assert isinstance(a, int)
            hashes = chain(a, b)
            view.parked(hashes, now, epoch)
            parked_at[hashes[-1]] = (now, epoch)
            confirmed.discard(hashes[-1])
            gone.discard(hashes[-1])
        else:
            assert isinstance(a, frozenset)
            hashes_added, tips = view.held(a, now, epoch)
            for tip in tips:
                at, tip_epoch = parked_at[tip]
                assert tip_epoch == epoch  # nothing from before a restart
                assert tip in a or (tip not in confirmed and now < at + bound)  # within the bound
                assert tip in hashes_added and tip not in gone
            gone |= {t for t in confirmed if t not in a}
            confirmed = (confirmed - gone) | {t for t in tips if t in a}
        assert view.blocks <= limit
