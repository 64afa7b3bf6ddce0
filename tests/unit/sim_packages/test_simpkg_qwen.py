"""The qwen3-30b-a3b package carries the source documents' geometry, memory, compiler and
tokenizer figures.

Expected numbers are typed in from docs/sources.md (001 §5, 003 §6-8), not taken from
the code under test.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from calculet.common.errors import FailedPrecondition, InvalidArgument
from calculet.daemon.package.manifest import load_manifest
from calculet.ops.sim_packages import build_sim_package

GIB = 1 << 30
DRAM_PER_CHIP = 16 * GIB  # the vendor's 16777216 (KiB) per chip, docs/sources.md 003 §7
PARAMS_DRAM = (9_389_477_888, 8_767_148_032)
PARAMS_SRAM = 15_079_424
DRAM_RESERVED = 15_113_064_448
KV_ONE_LANE_PER_CHIP = 2_013_265_920
KV_PER_TOKEN = 48 * 4 * 2 * 128 * 2  # layers x kv heads x (K,V) x head_dim x bf16


def test_geometry_is_the_seeds(qwen_pkg: Path) -> None:
    m = load_manifest(qwen_pkg)
    a = m.architecture
    assert (a.layers, a.hidden_size, a.q_heads, a.kv_heads, a.head_dim) == (48, 2048, 32, 4, 128)
    assert (a.experts, a.experts_per_token, a.expert_intermediate) == (128, 8, 768)
    assert a.vocab_size == 151_936
    assert a.rope_theta == 1e6
    assert m.kernel == "synthetic"
    assert m.quantization == "W8A8/W4AF16"
    assert (m.topology.chips, m.topology.chip_masks) == (2, (1, 2))


def test_memory_is_the_seeds(qwen_pkg: Path) -> None:
    m = load_manifest(qwen_pkg)
    chips = m.memory.chips
    assert [c.param_dram_bytes for c in chips] == list(PARAMS_DRAM)
    assert [c.param_sram_bytes for c in chips] == [PARAMS_SRAM, PARAMS_SRAM]
    assert [c.chip_mask for c in chips] == [1, 2]
    for c in chips:
        assert c.workspace_bytes == DRAM_RESERVED - c.param_dram_bytes - KV_ONE_LANE_PER_CHIP
    assert m.kv.bytes_per_token == KV_PER_TOKEN == 98_304
    kv_share = m.kv.lanes * m.kv.lane_context * KV_PER_TOKEN // 2
    assert m.memory.device_memory_required_bytes == sum(
        c.param_dram_bytes + c.workspace_bytes + kv_share for c in chips
    )


def _fits(lanes: int, ctx: int) -> bool:
    # params + workspace = the reservation minus one lane's KV, on both chips.
    return DRAM_RESERVED - KV_ONE_LANE_PER_CHIP + lanes * ctx * KV_PER_TOKEN // 2 <= DRAM_PER_CHIP


def test_default_lanes_and_context_are_the_largest_that_fit(qwen_pkg: Path) -> None:
    m = load_manifest(qwen_pkg)
    assert m.kv.lanes == 16  # the largest default decode batch
    ctx = m.kv.lane_context
    assert ctx % 256 == 0 and ctx <= 40_960
    assert _fits(16, ctx) and not _fits(16, ctx + 256)


def test_one_lane_gets_the_full_calbin_context(tmp_path: Path) -> None:
    m = load_manifest(build_sim_package("qwen3-30b-a3b", tmp_path / "p", decode_batches=[1]))
    assert (m.kv.lanes, m.kv.lane_context) == (1, 40_960)


def test_overrides(tmp_path: Path) -> None:
    m = load_manifest(build_sim_package("qwen3-30b-a3b", tmp_path / "p", [1, 4], lanes=6, lane_context=1000))
    assert (m.kv.lanes, m.kv.lane_context) == (6, 1000)
    assert [s.name for s in m.submodels] == ["prefill", "decode_b1", "decode_b4"]


def test_kv_that_does_not_fit_is_refused_before_writing(tmp_path: Path) -> None:
    with pytest.raises(FailedPrecondition, match="chip 0 DRAM over"):
        build_sim_package("qwen3-30b-a3b", tmp_path / "p", lanes=16, lane_context=40_960)
    assert not (tmp_path / "p").exists()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"lanes": 8}, "largest decode batch"),
        ({"lane_context": 40_961}, "lane context"),
        ({"lane_context": 0}, "lane context"),
        ({"lane_context": 20}, "golden run needs"),  # 17 prompt tokens (Qwen3's tokenizer) + 9 greedy
        ({"decode_batches": []}, "at least one"),
        ({"decode_batches": [0]}, "1..16"),
        ({"decode_batches": [17]}, "1..16"),
        ({"decode_batches": [4, 4]}, "more than once"),
    ],
)
def test_bad_options_are_invalid_arguments(tmp_path: Path, kwargs: dict, match: str) -> None:
    with pytest.raises(InvalidArgument, match=match):
        build_sim_package("qwen3-30b-a3b", tmp_path / "p", **kwargs)
    assert not (tmp_path / "p").exists()


def test_unknown_preset(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="unknown preset"):
        build_sim_package("llama", tmp_path / "p")


def test_submodels(qwen_pkg: Path) -> None:
    m = load_manifest(qwen_pkg)
    assert [s.name for s in m.submodels] == ["prefill", "decode_b1", "decode_b4", "decode_b8", "decode_b16"]
    pre = m.submodel("prefill")
    assert (pre.role, pre.smodel_type, pre.batch, pre.max_tokens, pre.context) == (
        "prefill", "llm_prefill", 1, 40_960, 40_960,
    )  # fmt: skip
    assert [(t.name, t.shape, t.dtype) for t in pre.inputs] == [
        ("tokens", (1, 40_960), "int32"),
        ("positions", (1, 40_960), "int32"),
    ]
    assert [(t.name, t.shape, t.dtype) for t in pre.outputs] == [("logits", (1, 151_936), "bf16")]
    for b in (1, 4, 8, 16):
        d = m.submodel(f"decode_b{b}")
        assert (d.role, d.smodel_type, d.batch, d.max_tokens) == ("decode", "llm_decode", b, 1)
        assert [t.shape for t in d.inputs] == [(b, 1), (b, 1)]
        assert [t.shape for t in d.outputs] == [(b, 151_936)]
        # One uint32 register per row, docs/sources.md 003 §5 base offsets, no overlaps.
        offsets = [int(v, 16) for v in d.csr.values()]
        assert len(offsets) == 2 * b == len(set(offsets))
        assert d.csr["cur_seq_len[0]"] == "0x1104" and d.csr["past_kv_cur_seq_len[0]"] == "0x1144"


def test_compatibility_and_tokenizer(qwen_pkg: Path) -> None:
    m = load_manifest(qwen_pkg)
    assert m.compatibility.runtime == ">=0.7.6,<0.8"
    assert m.compatibility.compiler == {
        "calcc": "575c2d708e306a60f10bc34f5087477073b58caa",
        "tvm": "7aebd1c21fa67d942a1fd93e39e8a67007f91c0c",
    }
    assert m.tokenizer.model_max_length == 131_072  # as the real file says; the validator clamps
    assert m.context <= 40_960


def test_param_blocks_are_small_standins(qwen_pkg: Path) -> None:
    for chip in (0, 1):
        path = qwen_pkg / f"param_blk{chip}.bin"
        assert path.stat().st_size < 4096
        assert "STAND-IN" in path.read_text()
