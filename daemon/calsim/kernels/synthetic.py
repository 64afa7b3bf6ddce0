"""The synthetic calsim kernel: cheap logits at any geometry, an exact function of each lane's KV.

Data flow: a prefill/decode writes, per KV slot of its lane, the prefix-hash chain value
`H[i]` (hashing.py) of every token and position stored in slots 0..i. The logits of a slot are a
function of `H` at that slot and the package's `synthetic_seed` only (`LogitShaper`): a fixed base
table rolled by a hash-derived shift, a few hash-chosen peaks, EOS held low except on a rare
hash-chosen step. Changing any earlier token of a lane therefore changes every later logits row,
and a cleared or corrupted lane shows in the output. One difference from attention: a row reads
only slot `past_kv_len - 1`, whose value encodes slots 0..past-1 as they were when it was written;
rewriting an earlier slot without rewriting the slots after it (only possible when a caller passes
a `past_kv_len` that skips slots it did not write) is not seen until those slots are rewritten.

Ownership: the kernel owns `_chain` (uint64 [lanes, lane_context], the emulated device KV memory).
Which request owns a lane is the daemon's business; the kernel trusts `past_kv_len` like the real
device, reading slot `past_kv_len - 1` and writing slots past_kv_len.. of the lane it is given.
One caller at a time (calsim's compute unit); not thread-safe.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from calculet.daemon.calsim.kernel import DecodeRow, Kernel
from calculet.daemon.calsim.kernels.errors import KernelConfigError
from calculet.daemon.calsim.kernels.hashing import GOLDEN, U64, PowerTable, derive_key, splitmix64, token_hash
from calculet.daemon.calsim.kernels.validation import Bounds, check_decode, check_lane, check_prefill
from calculet.daemon.package.manifest import PackageManifest

_TOKEN_KEY = 1
_SHAPE_KEY = 2
_BASE_KEY = 3


class LogitShaper:
    """Turns chain values into logits rows; fixed per (vocab, eos ids, seed).

    Shape of a row: base table ~ N(0, BASE_SCALE) rolled by `shift`; PEAKS tokens set to heights
    in [PEAK_LOW, PEAK_LOW + PEAK_SPAN) (well above the base's max, about 4.5 at vocab 151,936, and
    with enough mass that temperature-1 sampling lands on a peak most of the time); EOS ids capped at
    EOS_CAP, except on about 1 step in EOS_PERIOD where one EOS id is set above every peak.

    Args:
        vocab_size: logits per row (>= 1).
        eos_token_ids: ids to keep low; each in [0, vocab_size).
        seed: the package's `synthetic_seed`.
    """

    BASE_SCALE = 1.0
    PEAKS = 6
    PEAK_LOW = 10.0
    PEAK_SPAN = 6.0
    EOS_CAP = 0.0
    EOS_PERIOD = 200
    EOS_MARGIN = 1.0

    def __init__(self, vocab_size: int, eos_token_ids: Sequence[int], seed: int) -> None:
        self.vocab_size = vocab_size
        self.eos = np.asarray(eos_token_ids, dtype=np.int64)
        self._key = derive_key(seed, _SHAPE_KEY)
        rng = np.random.default_rng(derive_key(seed, _BASE_KEY))
        self.base = (rng.standard_normal(vocab_size, dtype=np.float32) * self.BASE_SCALE).astype(np.float32)
        # Draw k of a row is splitmix64(s + k * GOLDEN), the splitmix64 sequence seeded by s:
        # [0] shift, [1..P] peak ids, [P+1..2P] peak heights, [-2] EOS event, [-1] which EOS.
        self._steps = np.arange(3 + 2 * self.PEAKS, dtype=U64) * GOLDEN

    def logits(self, chain: np.ndarray) -> np.ndarray:
        """Logits for each chain value.

        Args:
            chain: uint64 [B], chain values of the last written slot of each row.

        Returns:
            float32 [B, vocab_size], a fresh array.
        """
        rows = chain.shape[0]
        v = self.vocab_size
        seeds = splitmix64(chain ^ U64(self._key))
        draws = splitmix64(seeds[:, None] + self._steps[None, :])
        out = np.empty((rows, v), dtype=np.float32)
        shifts = (draws[:, 0] % U64(v)).astype(np.int64)
        for r in range(rows):
            s = int(shifts[r])
            # Roll by two slice copies into `out`: no np.roll temporary.
            out[r, : v - s] = self.base[s:]
            out[r, v - s :] = self.base[:s]
        p = self.PEAKS
        peak_ids = (draws[:, 1 : 1 + p] % U64(v)).astype(np.int64)
        heights = self.PEAK_LOW + self.PEAK_SPAN * _unit(draws[:, 1 + p : 1 + 2 * p])
        out[np.arange(rows)[:, None], peak_ids] = heights
        if self.eos.size:
            self._hold_eos(out, draws[:, -2], draws[:, -1])
        return out

    def _hold_eos(self, out: np.ndarray, event: np.ndarray, pick: np.ndarray) -> None:
        out[:, self.eos] = np.minimum(out[:, self.eos], np.float32(self.EOS_CAP))
        fire = np.flatnonzero(event % U64(self.EOS_PERIOD) == U64(0))
        if fire.size:
            chosen = self.eos[(pick[fire] % U64(self.eos.size)).astype(np.int64)]
            out[fire, chosen] = out[fire].max(axis=1) + np.float32(self.EOS_MARGIN)


def _unit(x: np.ndarray) -> np.ndarray:
    """uint64 -> float32 uniform in [0, 1) from the top 53 bits."""
    return ((x >> U64(11)).astype(np.float64) * (1.0 / (1 << 53))).astype(np.float32)


class SyntheticKernel(Kernel):
    """Hash-chain KV and shaped logits for any geometry (see the module docstring).

    Args:
        manifest: supplies vocab size, EOS ids and `synthetic_seed`.
        package_dir: unused (the synthetic kernel needs no weight files).
        lanes: KV lanes to allocate (>= 1).
        lane_context: KV slots per lane (>= 1).

    Raises:
        KernelConfigError: a non-positive size, or an EOS id outside the vocab.
    """

    def __init__(self, manifest: PackageManifest, package_dir: Path, lanes: int, lane_context: int) -> None:
        vocab = manifest.architecture.vocab_size
        for name, value in (("vocab_size", vocab), ("lanes", lanes), ("lane_context", lane_context)):
            if value < 1:
                raise KernelConfigError(f"synthetic kernel: {name} must be >= 1, got {value}")
        bad = [e for e in manifest.tokenizer.eos_token_ids if not 0 <= e < vocab]
        if bad:
            raise KernelConfigError(f"synthetic kernel: EOS ids {bad} outside the vocab [0, {vocab})")
        self.vocab_size = vocab
        self.lanes = lanes
        self.lane_context = lane_context
        self._bounds = Bounds(vocab, lanes, lane_context)
        self._token_key = derive_key(manifest.synthetic_seed, _TOKEN_KEY)
        self._powers = PowerTable(lane_context)
        self._shaper = LogitShaper(vocab, manifest.tokenizer.eos_token_ids, manifest.synthetic_seed)
        self._chain = np.zeros((lanes, lane_context), dtype=U64)

    def prefill(self, lane: int, past_kv_len: int, tokens: np.ndarray, positions: np.ndarray) -> np.ndarray:
        tok, pos = check_prefill(self._bounds, lane, past_kv_len, tokens, positions)
        prev = self._chain[lane, past_kv_len - 1 : past_kv_len] if past_kv_len else np.zeros(1, dtype=U64)
        values = self._powers.extend(prev, token_hash(tok, pos, self._token_key))
        self._chain[lane, past_kv_len : past_kv_len + tok.shape[0]] = values
        return self._shaper.logits(values[-1:])[0]

    def decode(self, rows: Sequence[DecodeRow]) -> np.ndarray:
        batch = check_decode(self._bounds, rows)
        # Slot past-1 of each lane; rows at past 0 start from an empty chain (0). The index is
        # clipped only so rows at past 0 do not read slot -1; their value is replaced by 0.
        prev = self._chain[batch.lanes, np.maximum(batch.past - 1, 0)]
        prev[batch.past == 0] = 0
        values = PowerTable.step(prev, token_hash(batch.tokens, batch.positions, self._token_key))
        self._chain[batch.lanes, batch.past] = values
        return self._shaper.logits(values)

    def clear_lane(self, lane: int) -> None:
        check_lane(self._bounds, lane, "clear_lane")
        self._chain[lane] = 0

    def corrupt_lane(self, lane: int, rng: np.random.Generator) -> None:
        check_lane(self._bounds, lane, "corrupt_lane")
        top = np.iinfo(np.uint64).max
        self._chain[lane] = rng.integers(0, top, size=self.lane_context, dtype=U64, endpoint=True)

    @property
    def kv_bytes(self) -> int:
        return int(self._chain.nbytes)
