"""The qwen3-30b-a3b-b1 package: today's calbin as docs/sources.md describes it (001 §1, §3,
§5, §9; 003 §5, §7, §8, §12). Expected figures are typed in from those sections, not read from the
code under test."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from calculet.common.errors import InvalidArgument
from calculet.daemon.package.capacity import DeviceLimits
from calculet.daemon.package.manifest import MANIFEST_NAME, load_manifest
from calculet.daemon.package.validate import validate_package
from calculet.ops.sim_packages import build_sim_package

DRAM_RESERVED_PER_CHIP = 15_113_064_448  # docs/sources.md 003 §7
CONTEXT = 40_960  # docs/sources.md 001 §5


def test_one_lane_one_decode_and_the_whole_context_in_one_prefill(b1_pkg: Path) -> None:
    m = load_manifest(b1_pkg)
    assert (m.name, m.kernel, m.architecture.vocab_size) == ("calsim-qwen3-30b-a3b-b1", "synthetic", 151_936)
    assert (m.kv.lanes, m.kv.lane_context) == (1, CONTEXT)
    prefill, decode = m.submodels
    assert (prefill.name, prefill.role, prefill.batch, prefill.max_tokens) == ("prefill", "prefill", 1, CONTEXT)
    assert [t.shape for t in prefill.inputs] == [(1, CONTEXT), (1, CONTEXT)]  # 003 §5: tokens, positions
    assert (decode.name, decode.role, decode.batch, decode.smodel_type) == ("decode", "decode", 1, "llm_decode")
    # The memory plan of one full lane is 003 §7's reservation, per chip: params + workspace + KV.
    assert m.memory.device_memory_required_bytes == 2 * DRAM_RESERVED_PER_CHIP


def test_the_prefill_keeps_the_vendor_mislabel_and_declares_nothing_about_offsets(b1_pkg: Path) -> None:
    raw = json.loads((b1_pkg / MANIFEST_NAME).read_text(encoding="utf-8"))
    prefill = next(s for s in raw["submodels"] if s["role"] == "prefill")
    assert prefill["smodel_type"] == "llm_decode"  # 001 §9 P0.7, 003 §12
    assert "prefill_at_offset" not in prefill  # docs/sources.md never says it computes after past_kv_len > 0
    info = (b1_pkg / "prefill" / "submodel_memory_reserved_info.txt").read_text(encoding="utf-8")
    assert "smodel_type: llm_decode" in info


def test_it_validates_with_the_label_warning_on_cal_rt_0_7_6_only(b1_pkg: Path) -> None:
    report = validate_package(b1_pkg)
    assert report.ok, report.render_text()
    assert sorted(p.code for p in report.problems) == ["submodel.label_ignored", "tokenizer.max_length_clamped"]
    m = report.manifest
    assert m is not None
    (row,) = m.compatibility.matrix
    assert (row.runtime, row.driver, row.co_resident) == (">=0.7.6,<0.7.7", ">=0.7.6,<1.0", False)
    # driver 1.0.0 (co-resident calbins) and runtime 0.7.7 are outside what this calbin was built for
    for device in (DeviceLimits(driver_version="1.0.0"), DeviceLimits(runtime_version="0.7.7")):
        assert not validate_package(b1_pkg, device, verify_hashes=False).ok


@pytest.mark.parametrize("options", [{"decode_batches": (1, 4)}, {"decode_batches": (4,)}, {"lanes": 2}])
def test_other_batches_or_lanes_are_refused(options: dict[str, object], tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="qwen3-30b-a3b-b1"):
        build_sim_package("qwen3-30b-a3b-b1", tmp_path / "p", **options)  # type: ignore[arg-type]  # dict of the keyword arguments
    assert not (tmp_path / "p").exists()
