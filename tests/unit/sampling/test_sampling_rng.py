"""The counter-based RNG: SplitMix64's published output, range, determinism, independence."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from calculet.daemon.sampling.rng import GAMMA, MASK64, draw_bits, mix64, uniform

U64 = st.integers(0, MASK64)


def test_mix64_reproduces_the_published_splitmix64_stream() -> None:
    # SplitMix64 seeded with 0 outputs mix(GAMMA), mix(2*GAMMA), ... (reference: Vigna's splitmix64.c).
    assert mix64(GAMMA) == 0xE220A8397B1DCDAF
    assert mix64(2 * GAMMA & MASK64) == 0x6E789E6AA1B965F4
    assert mix64(3 * GAMMA & MASK64) == 0x06C45D188009454F


@given(U64, U64)
def test_uniform_is_in_the_half_open_unit_interval_and_repeatable(seed: int, step: int) -> None:
    u = uniform(seed, step)
    assert 0.0 <= u < 1.0
    assert uniform(seed, step) == u


def test_uniform_never_reaches_one_even_for_all_ones_bits() -> None:
    assert ((MASK64 >> 11) * 2.0**-53) < 1.0


def test_draws_are_uniform_over_steps_and_over_seeds() -> None:
    n, bins = 20_000, 20
    expected = n / bins
    over_steps = np.histogram([uniform(12345, s) for s in range(n)], bins=bins, range=(0, 1))[0]
    over_seeds = np.histogram([uniform(s, 7) for s in range(n)], bins=bins, range=(0, 1))[0]
    for counts in (over_steps, over_seeds):
        chi2 = float(((counts - expected) ** 2 / expected).sum())
        assert chi2 < 60.0  # df=19: p(chi2 > 60) ~ 4e-6


def test_neighbouring_seeds_and_steps_are_uncorrelated() -> None:
    a = np.array([uniform(s, 0) for s in range(5000)])
    b = np.array([uniform(s + 1, 0) for s in range(5000)])
    c = np.array([uniform(0, s) for s in range(5000)])
    d = np.array([uniform(0, s + 1) for s in range(5000)])
    assert abs(np.corrcoef(a, b)[0, 1]) < 0.06
    assert abs(np.corrcoef(c, d)[0, 1]) < 0.06


def test_seeds_gamma_apart_do_not_give_shifted_streams() -> None:
    # A plain SplitMix64 keyed by the raw seed would make (s + GAMMA, n) equal (s, n + 1).
    shifted = [draw_bits((5 + GAMMA) & MASK64, n) for n in range(50)]
    base = [draw_bits(5, n + 1) for n in range(50)]
    assert not set(shifted) & set(base)
