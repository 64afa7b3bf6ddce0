"""calsim with `lane_selection=false`: row i of a decode job is slot i, idle rows are masked by the
`inactive_rows` rule, and a job of compiled batch B costs B rows whatever is active (`device/slots.py`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from calculet.daemon.calsim.device import CalsimDevice, CalsimModel
from calculet.daemon.calsim.options import parse_options
from calculet.daemon.device.errors import InvalidJob, RowOffSlot
from calculet.daemon.device.types import InactiveRows, JobStatus, RowSpec

from .conftest import OpenDevice
from .factories import DECODE1, DECODE4, PREFILL, bitwise_equal, expected_row, make_bufs, make_manifest, prefill_spec


def fixed(open_device: OpenDevice, tmp_path: Path, rule: str) -> tuple[CalsimDevice, CalsimModel]:
    device = open_device(lane_selection=False, inactive_rows=rule)
    return device, device.configure(tmp_path, make_manifest())


def test_the_options_set_the_declared_capabilities(open_device: OpenDevice) -> None:
    caps = open_device(lane_selection=False, inactive_rows="ALL").info().capabilities
    assert (caps.lane_selection, caps.inactive_rows) == (False, InactiveRows.ALL)
    assert open_device().info().capabilities.lane_selection is True
    for bad in ({"lane_selection": "no"}, {"inactive_rows": "auto"}):
        with pytest.raises(InvalidJob, match=next(iter(bad))):
            parse_options(bad)


@pytest.mark.parametrize("rule", ["only_valid", "all"])
def test_a_decode_row_on_its_slot_between_masked_rows_is_computed_and_the_masked_ones_are_not(
    open_device: OpenDevice, tmp_path: Path, rule: str
) -> None:
    device, model = fixed(open_device, tmp_path, rule)
    pre, dec = make_bufs(device, model, PREFILL), make_bufs(device, model, DECODE4)
    # A batch-1 prefill names its slot.
    assert device.submit(model, prefill_spec(pre, 2, [5, 6, 7])).wait(5) is JobStatus.DONE
    dec.tokens.array[2, 0], dec.positions.array[2, 0] = 9, 3
    rows = [RowSpec.masked(0), RowSpec.masked(1), RowSpec(2, 3, 1)]
    if rule == "all":
        rows.append(RowSpec.masked(3))
    assert device.submit(model, dec.spec(rows)).wait(5) is JobStatus.DONE
    assert bitwise_equal(dec.out(2), expected_row([5, 6, 7, 9], [0, 1, 2, 3]))
    assert not np.asarray(dec.logits.array[:2], dtype=np.float32).any()  # masked rows: nothing computed


@pytest.mark.parametrize(
    ("rule", "rows", "submodel", "why"),
    [
        ("only_valid", [RowSpec(2, 0, 1)], DECODE4, "row 0 .* names KV lane 2"),
        ("only_valid", [RowSpec(1, 0, 1)], DECODE1, "row 0 .* names KV lane 1"),
        ("only_valid", [RowSpec(0, 0, 1), RowSpec(2, 0, 1)], DECODE4, "row 1 .* names KV lane 2"),
        ("only_valid", [RowSpec(0, 0, 1), RowSpec.masked(1)], DECODE4, "only_valid ends at the last active row"),
        ("all", [RowSpec(0, 0, 1)], DECODE4, "all names every one of its 4 rows"),
        ("all", [RowSpec.masked(i) for i in range(4)], DECODE4, "every row is masked"),
        ("only_valid", [RowSpec(0, 0, 0)], PREFILL, "a masked row .* needs a fixed-slot job"),
    ],
)
def test_a_row_off_its_slot_or_idle_rows_off_the_rule_are_refused(
    open_device: OpenDevice, tmp_path: Path, rule: str, rows: list[RowSpec], submodel: str, why: str
) -> None:
    device, model = fixed(open_device, tmp_path, rule)
    with pytest.raises(RowOffSlot, match=why):
        device.submit(model, make_bufs(device, model, submodel).spec(rows))
    assert device.counters().submitted == 0


def test_with_lane_selection_the_same_off_slot_row_runs(device: CalsimDevice, model: CalsimModel) -> None:
    dec = make_bufs(device, model, DECODE4)
    assert device.submit(model, dec.spec([RowSpec(2, 0, 1)])).wait(5) is JobStatus.DONE


def test_a_fixed_slot_job_moves_all_its_rows_whatever_is_active(
    open_device: OpenDevice, device: CalsimDevice, model: CalsimModel, tmp_path: Path
) -> None:
    def copies(dev: CalsimDevice, m: CalsimModel, rows: list[RowSpec]) -> tuple[float, float]:
        sub = dev.submit(m, make_bufs(dev, m, DECODE4).spec(rows))
        assert sub.wait(5) is JobStatus.DONE
        ts = sub.timestamps()
        assert ts is not None
        return ts.h2d, ts.d2h

    one = [RowSpec(0, 0, 1)]
    four = [RowSpec(i, 0, 1) for i in range(4)]
    fixed_device, fixed_model = fixed(open_device, tmp_path / "fixed", "only_valid")
    assert copies(fixed_device, fixed_model, one) == pytest.approx(copies(fixed_device, fixed_model, four))
    selecting_one, selecting_four = copies(device, model, one), copies(device, model, four)
    assert selecting_one[0] < selecting_four[0] and selecting_one[1] < selecting_four[1]
    assert copies(fixed_device, fixed_model, one) == pytest.approx(selecting_four)
