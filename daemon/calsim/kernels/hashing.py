"""uint64 hashing for the synthetic kernel: splitmix64 and a polynomial prefix-hash chain.

All arithmetic is on uint64 numpy ARRAYS, which wrap modulo 2**64 silently (numpy scalars warn on
overflow, so callers pass 1-element arrays rather than scalars).

The chain over a lane is `H[i] = H[i-1] * B + h[i]  (mod 2**64)` with `h[i] = token_hash(token_i,
position_i)` and `H[-1] = 0`. It is linear in the `h`, which makes prefill of n tokens one
vectorised O(n) pass (`extend`), and any change of one `h[j]` changes every later `H[i]` for certain:
the change is `(h' - h) * B**(i-j)`, nonzero because `B` is odd (hence invertible mod 2**64) and
`token_hash` is a bijection of `(token, position)`.
"""

from __future__ import annotations

import numpy as np

U64 = np.uint64
GOLDEN = U64(0x9E3779B97F4A7C15)
_M1 = U64(0xBF58476D1CE4E5B9)
_M2 = U64(0x94D049BB133111EB)
_S30 = U64(30)
_S27 = U64(27)
_S31 = U64(31)
_S32 = U64(32)
# Chain multiplier: odd, so invertible mod 2**64.
CHAIN_BASE = 0xD1B54A32D192ED03
_MOD = 1 << 64


def splitmix64(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser applied elementwise to `x + GOLDEN` (a bijection of uint64).

    Args:
        x: uint64 array (any shape).

    Returns:
        a new uint64 array of the same shape.
    """
    z = x + GOLDEN
    z = (z ^ (z >> _S30)) * _M1
    z = (z ^ (z >> _S27)) * _M2
    return z ^ (z >> _S31)


def token_hash(tokens: np.ndarray, positions: np.ndarray, key: int) -> np.ndarray:
    """Per-slot fingerprint of `(token, position)` under `key`; distinct pairs give distinct hashes.

    Args:
        tokens: int64 [n], each in [0, 2**32).
        positions: int64 [n], each in [0, 2**32).
        key: 64-bit key (from the package seed).

    Returns:
        uint64 [n].
    """
    packed = tokens.astype(U64) | (positions.astype(U64) << _S32)
    return splitmix64(packed ^ U64(key & (_MOD - 1)))


def derive_key(seed: int, purpose: int) -> int:
    """A 64-bit key for one purpose (token hashing, logits shaping...) from the package seed."""
    arr = np.array([(seed * 0x100000001B3 + purpose) % _MOD], dtype=U64)
    return int(splitmix64(arr)[0])


class PowerTable:
    """`B**k` and `B**-k` mod 2**64 for k in 0..length, precomputed once per kernel."""

    def __init__(self, length: int) -> None:
        inverse = pow(CHAIN_BASE, -1, _MOD)
        self.pow = np.ones(length + 1, dtype=U64)
        self.inv = np.ones(length + 1, dtype=U64)
        if length > 0:
            # cumprod on uint64 arrays wraps mod 2**64, which is exactly modular exponentiation.
            self.pow[1:] = np.cumprod(np.full(length, CHAIN_BASE, dtype=U64))
            self.inv[1:] = np.cumprod(np.full(length, inverse, dtype=U64))

    def extend(self, prev: np.ndarray, hashes: np.ndarray) -> np.ndarray:
        """Chain values after appending `hashes` to a chain ending in `prev`.

        `H[i] = B**(i+1) * prev + B**i * sum_{j<=i} hashes[j] * B**-j`, one vectorised pass.

        Args:
            prev: uint64 [1], the chain value before the first new slot (0 for an empty lane).
            hashes: uint64 [n], n <= length.

        Returns:
            uint64 [n], the chain value at each new slot.
        """
        n = hashes.shape[0]
        scaled = np.cumsum(hashes * self.inv[:n], dtype=U64)
        return self.pow[1 : n + 1] * prev + self.pow[:n] * scaled

    @staticmethod
    def step(prev: np.ndarray, hashes: np.ndarray) -> np.ndarray:
        """One slot appended to each of several chains: `prev * B + hashes` (uint64 [B] each)."""
        return prev * U64(CHAIN_BASE) + hashes
