"""Counter-based RNG: one uniform draw per (seed, step), with no state between calls.

A request's token at step n is drawn with `uniform(seed, n)`; nothing else feeds the draw, so the
token does not depend on which lane, batch position, batch size, board or retry produced it.
That is what lets the daemon re-prefill a lost lane and the gateway fail over mid-stream and still
emit exactly the tokens of an undisturbed run (docs/daemon.md, Determinism).

The hash is SplitMix64's output function (Steele, Lea, Flood 2014; the finaliser of Java's
SplittableRandom) applied to a stream keyed by the mixed seed: `mix(mix(seed) + (step + 1) * GAMMA)`.
Mixing the seed first means seeds that differ by a multiple of GAMMA do not give shifted copies of
each other's streams. Pure Python integers: the same bits on every platform and numpy version.

Scope of "same tokens": u is bit-identical everywhere; the probabilities it is compared with are
numpy float32 exp and sums, bit-identical for one numpy build on one CPU SIMD level. numpy does not
promise the same last bits from its AVX2 and AVX-512 kernels, so between boards with different
CPUs a token could differ when u falls within ~1e-7 of a CDF boundary. A fleet that needs strict
equality pins the numpy build and its dispatch (NPY_DISABLE_CPU_FEATURES).
"""

from __future__ import annotations

MASK64 = (1 << 64) - 1
GAMMA = 0x9E3779B97F4A7C15  # 2^64 / golden ratio, SplitMix64's increment
_SEED_SALT = 0xD1B54A32D192ED03  # so that seed 0 does not key the stream with mix(0) == 0
_TWO_POW_M53 = 2.0**-53


def mix64(x: int) -> int:
    """SplitMix64 finaliser: a bijection on 64-bit integers with full avalanche."""
    x &= MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def draw_bits(seed: int, step: int) -> int:
    """64 pseudo-random bits for `(seed, step)`; both are taken modulo 2^64."""
    key = mix64(seed ^ _SEED_SALT)
    return mix64(key + ((step + 1) & MASK64) * GAMMA)


def uniform(seed: int, step: int) -> float:
    """A uniform double in [0, 1) with 53 random bits (so it is never 1.0)."""
    return (draw_bits(seed, step) >> 11) * _TWO_POW_M53


def uniform_at(seed: int, step: int, k: int) -> float:
    """The k-th uniform of `(seed, step)` for draws that need more than one: k = 0 is `uniform(seed,
    step)`; each k > 0 re-mixes those bits with k (a bijection for each k), so the sequence is as
    stateless and reproducible as the first draw."""
    if not k:
        return uniform(seed, step)
    return (mix64(draw_bits(seed, step) + (k & MASK64) * GAMMA) >> 11) * _TWO_POW_M53
