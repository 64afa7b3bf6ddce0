"""`StopMatcher`: OpenAI stop strings matched across delta boundaries. The oracle cuts the whole
text before the earliest occurrence of any stop string, whatever the deltas were."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from calculet.gateway.text.stops import StopMatcher

ALPHABET = "ab"  # small, so stop strings occur (and nest) often


def _expected(text: str, stops: list[str]) -> tuple[str, bool]:
    starts = [i for i in (text.find(s) for s in stops if s) if i >= 0]
    return (text[: min(starts)], True) if starts else (text, False)


def _run(stops: list[str], deltas: list[str]) -> tuple[str, bool, list[str]]:
    """Drive the matcher as the choice runner does; returns (released text, stopped, releases)."""
    m = StopMatcher(stops)
    releases: list[str] = []
    for delta in deltas:
        r = m.feed(delta)
        releases.append(r.text)
        assert r.stopped == m.stopped
        if r.stopped:
            break
    if not m.stopped:
        releases.append(m.flush())
    return "".join(releases), m.stopped, releases


def _split(text: str, cuts: list[int]) -> list[str]:
    bounds = [0, *sorted(c % (len(text) + 1) for c in cuts), len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


@settings(max_examples=400, deadline=None)
@given(
    text=st.text(ALPHABET, max_size=30),
    stops=st.lists(st.text(ALPHABET, min_size=1, max_size=4), min_size=1, max_size=3),
    cuts=st.lists(st.integers(0, 1000), max_size=10),
)
@example(text="abc", stops=["abc", "b"], cuts=[2])  # a stop inside a longer one, completed first
@example(text="abx", stops=["abc", "b"], cuts=[2])
@example(text="ab", stops=["abc", "b"], cuts=[])
@example(text="aab", stops=["ab", "aab"], cuts=[1, 2])
def test_released_text_is_cut_before_the_earliest_stop(text: str, stops: list[str], cuts: list[int]) -> None:
    released, stopped, releases = _run(stops, _split(text, cuts))
    want, want_stopped = _expected(text, stops)
    assert (released, stopped) == (want, want_stopped)
    so_far = ""
    for piece in releases:
        so_far += piece
        assert not any(s in so_far for s in stops), (so_far, stops)


def test_stop_spread_over_three_deltas() -> None:
    m = StopMatcher(["</end>"])
    assert m.feed("hello </").text == "hello "
    r = m.feed("en")
    assert (r.text, r.stopped) == ("", False)
    r = m.feed("d> ignored")
    assert (r.text, r.stopped) == ("", True)
    assert m.stopped


def test_partial_stop_that_does_not_complete_is_released() -> None:
    m = StopMatcher(["STOP"])
    assert m.feed("ST").text == ""
    assert m.feed("OR").text == "STOR"
    assert m.feed("x ST").text == "x "
    assert m.flush() == "ST"
    assert not m.stopped


def test_stop_that_is_a_prefix_of_another() -> None:
    # Both start at the same place: the text before them is released either way.
    for stops in (["ab", "abc"], ["abc", "ab"]):
        m = StopMatcher(stops)
        assert m.feed("xa").text == "x"
        r = m.feed("bc")
        assert (r.text, r.stopped) == ("", True)
    m = StopMatcher(["abc", "abd"])
    assert m.feed("zab").text == "z"
    r = m.feed("e")
    assert (r.text, r.stopped) == ("abe", False)


def test_feeding_after_stop_raises() -> None:
    m = StopMatcher(["x"])
    assert m.feed("abxcd").text == "ab"
    with pytest.raises(RuntimeError):
        m.feed("more")
    assert m.flush() == ""


def test_empty_stop_strings_are_ignored() -> None:
    m = StopMatcher(["", "b"])
    assert m.active
    assert m.feed("aa").text == "aa"
    r = m.feed("ab")
    assert (r.text, r.stopped) == ("a", True)
    only_empty = StopMatcher([""])
    assert not only_empty.active
    assert only_empty.feed("anything").text == "anything"
    assert only_empty.flush() == ""


@settings(max_examples=50, deadline=None)
@given(deltas=st.lists(st.text(max_size=8), max_size=8))
def test_no_stops_passes_through(deltas: list[str]) -> None:
    m = StopMatcher([])
    assert not m.active
    out = [m.feed(d) for d in deltas]
    assert [r.text for r in out] == deltas
    assert not any(r.stopped for r in out)
    assert m.flush() == ""


def test_stop_inside_a_longer_one_waits_for_the_longer_one() -> None:
    # "b" completes first, but "abc" may still begin earlier: nothing is decided yet.
    m = StopMatcher(["b", "abc"])
    r = m.feed("xab")
    assert (r.text, r.stopped) == ("x", False)
    r = m.feed("c")
    assert (r.text, r.stopped) == ("", True)
    m = StopMatcher(["b", "abc"])
    assert m.feed("xab").text == "x"
    r = m.feed("z")
    assert (r.text, r.stopped) == ("a", True)
    # Generation ends while undecided: flush cuts before the shorter stop and reports the stop.
    m = StopMatcher(["b", "abc"])
    assert m.feed("xab").text == "x"
    assert m.flush() == "a"
    assert m.stopped
