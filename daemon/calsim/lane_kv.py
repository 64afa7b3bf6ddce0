"""How much of each KV lane of one configured model holds trustworthy KV, as calsim sees it.

The real runtime trusts `past_kv_len` in each row (docs/sources.md 001 §8); calsim additionally tracks,
per lane, the length of the KV its jobs actually wrote and nothing has destroyed since, and refuses
(`StaleKV`) a row that would attend over more. So a daemon that reads freed, cleared or corrupted KV
(a parked lane it should have dropped, a lane it closed, a lane a reset cleared) fails loudly here
instead of computing quietly on poison.

Data flow (every call under the device's one lock):
    submit        `check(rows)`    a row's past_kv_len <= valid length of its lane, or StaleKV
    kernel done   `written(rows)`  valid length = past_kv_len + cur_seq_len (a tail truncation: the
                                   positions past it are invalid from now on)
    CCU exception `lost(lanes)`    valid length 0 (its lanes were corrupted)
    close_lane    `lost((lane,))`  valid length 0 (KV Free poisons the lane's KV)
    reset         `clear()`        every lane 0

Ownership: one `LaneKV` per `CalsimModel`, owned by it; the device and its engine call it.
"""

from __future__ import annotations

from collections.abc import Iterable

from calculet.daemon.device.errors import StaleKV
from calculet.daemon.device.types import RowSpec


class LaneKV:
    """Valid KV length of each lane of one configured model.

    Args:
        lanes: number of lanes (>= 1).
    """

    def __init__(self, lanes: int) -> None:
        self._valid = [0] * lanes

    def valid(self, lane: int) -> int:
        """Tokens of `lane`, from position 0, that hold KV written by a finished job and not lost since."""
        return self._valid[lane]

    def check(self, rows: Iterable[RowSpec]) -> None:
        """Raises:
        StaleKV: a row's past_kv_len exceeds its lane's valid length (nothing changes)."""
        for i, row in enumerate(rows):
            valid = self._valid[row.lane]
            if row.past_kv_len > valid:
                raise StaleKV(
                    f"row {i}: past_kv_len {row.past_kv_len} on KV lane {row.lane}, which holds only {valid} "
                    "valid tokens (freed, cleared or corrupted KV)"
                )

    def written(self, rows: Iterable[RowSpec]) -> None:
        """A job's kernel call wrote these rows: each lane now holds exactly past + new tokens."""
        for row in rows:
            self._valid[row.lane] = row.past_kv_len + row.cur_seq_len

    def lost(self, lanes: Iterable[int]) -> None:
        """These lanes' KV is garbage now."""
        for lane in lanes:
            self._valid[lane] = 0

    def clear(self) -> None:
        """Every lane is empty (reset)."""
        self._valid = [0] * len(self._valid)
