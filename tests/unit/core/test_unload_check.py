"""Unload verification arithmetic: a footprint is what a configure took; a release must give it back."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from calculet.daemon.core.unload_check import footprint, unload_problem
from calculet.daemon.device.types import ChipMemory, MemoryUsage

TOTAL = 1 << 30


def usage(*chips: tuple[int, int]) -> MemoryUsage:
    return MemoryUsage(tuple(ChipMemory(i, d, TOTAL, s, TOTAL) for i, (d, s) in enumerate(chips)))


def test_footprint_is_the_change_per_chip_and_skips_untouched_chips() -> None:
    assert footprint(usage((10, 1), (0, 0)), usage((10, 1), (500, 7))) == {1: (500, 7)}


def test_a_release_that_gives_everything_back_passes() -> None:
    taken = {1: (500, 7)}
    assert unload_problem(taken, usage((10, 1), (600, 8)), usage((10, 1), (100, 1)), healthy=True) is None


def test_a_reset_that_frees_more_meanwhile_passes() -> None:
    assert unload_problem({0: (500, 0)}, usage((900, 0)), usage((0, 0)), healthy=True) is None


def test_kept_bytes_and_an_unhealthy_device_are_named() -> None:
    problem = unload_problem({1: (500, 7)}, usage((0, 0), (500, 7)), usage((0, 0), (64, 7)), healthy=False)
    assert problem == (
        "chip 1 still holds 64 B DRAM and 7 B SRAM of the 500 B / 7 B it took; the device reports unhealthy"
    )


@given(st.integers(0, 10**9), st.integers(1, 10**9), st.integers(0, 10**6))
def test_any_leak_is_caught(base: int, took: int, leak: int) -> None:
    before = usage((base + took, 0))
    after = usage((base + leak, 0))
    problem = unload_problem({0: (took, 0)}, before, after, healthy=True)
    assert (problem is None) == (leak == 0)
