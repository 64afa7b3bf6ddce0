"""Fixed slots: the row rules of a device without lane selection, checked and built in one place.

A calbin compiled for batch B with fixed slots binds row i of a decode job to KV slot i
(docs/sources.md 000 §6.2 step 2: a stable hardware lane per sequence); its runtime's KV layouts
`ONLY_VALID` / `ALL` (000 §6.3) say how the idle rows are named. The rules, when
`DeviceCapabilities.lane_selection` is false:

- A *slot-bound* job (every decode job, and a prefill job of compiled batch > 1) names row i with
  lane i. A batch-1 prefill job names its one row's slot through the lane register (the KV region
  KV Apply opened), which is how the prompt of slot 5 reaches slot 5 (docs/vendor-binding.md 2.4).
- An idle row is masked (`RowSpec.masked`: cur_seq_len 0, past_kv_len 0); it reads and writes no KV
  and its input rows hold zeros, never invented tokens (000 §6.2 step 4).
- `InactiveRows.ONLY_VALID`: the rows end at the highest active row. `InactiveRows.ALL`: the job
  names all B rows.

With lane selection every row is active (no masked row) and may name any lane, as before.

Who uses it: calsim (`calsim/job_check.py`) and `GuardedDevice` (`guard.py`) both refuse a job that
breaks the rules with `RowOffSlot`, and the daemon's executor builds its rows with `slot_rows`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from calculet.daemon.device.errors import RowOffSlot
from calculet.daemon.device.types import InactiveRows, RowSpec, SubmodelInfo, TaskType


def slot_bound(sub: SubmodelInfo) -> bool:
    """Whether row i of a job on `sub` is KV slot i on a device without lane selection."""
    return sub.task_type is TaskType.DECODE or sub.batch > 1


def check_slot_rows(rows: Sequence[RowSpec], sub: SubmodelInfo, lane_selection: bool, inactive: InactiveRows) -> None:
    """Check a job's rows against the device's slot rules (the module docstring).

    Raises:
        RowOffSlot: without lane selection: a masked row in a job that is not slot-bound; a row
            whose lane is not its index; a masked row with KV; no active row; idle rows named
            otherwise than `inactive` says.
    """
    if lane_selection:  # any lane, no masked row: the device's own row checks refuse a row of 0 tokens
        return
    masked = [i for i, r in enumerate(rows) if r.is_masked]
    if not slot_bound(sub):
        if masked:
            raise RowOffSlot(f"row {masked[0]}: a masked row (cur_seq_len 0) needs a fixed-slot job")
        return
    for i, row in enumerate(rows):
        if row.lane != i:
            raise RowOffSlot(
                f"row {i} of {sub.name!r} names KV lane {row.lane}: without lane selection row {i} is slot {i}"
            )
        if row.is_masked and row.past_kv_len:
            raise RowOffSlot(f"row {i}: a masked row reads no KV, got past_kv_len {row.past_kv_len}")
    if len(masked) == len(rows):
        raise RowOffSlot(f"{sub.name!r}: every row is masked")
    if inactive is InactiveRows.ALL and len(rows) != sub.batch:
        raise RowOffSlot(f"{sub.name!r}: inactive_rows all names every one of its {sub.batch} rows, got {len(rows)}")
    if inactive is InactiveRows.ONLY_VALID and rows[-1].is_masked:
        raise RowOffSlot(
            f"{sub.name!r}: inactive_rows only_valid ends at the last active row; row {len(rows) - 1} is masked"
        )


def slot_rows(active: Mapping[int, RowSpec], sub: SubmodelInfo, inactive: InactiveRows) -> tuple[RowSpec, ...]:
    """The rows of a slot-bound job whose active rows are `active` (slot -> row, each row's lane
    its slot): every idle slot below the highest active one masked, and for `ALL` every idle slot
    up to the batch."""
    end = sub.batch if inactive is InactiveRows.ALL else max(active) + 1
    return tuple(active.get(slot, RowSpec.masked(slot)) for slot in range(end))


__all__ = ["check_slot_rows", "slot_bound", "slot_rows"]
