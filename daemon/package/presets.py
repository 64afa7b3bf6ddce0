"""Model geometry and memory presets: the figures packages and capacity plans are built from.

This module owns data only: the geometry (docs/sources.md 001 §5) and the per-chip memory plan
(docs/sources.md 003 §6-8) of the models we know, as the manifest's own dataclasses so
`calctl package build-sim` can drop them into a manifest and `calctl capacity --preset` can plan
with them. Nothing here computes beyond the board-wide sum `memory_decl` needs; capacity
arithmetic lives in `calculet.daemon.package.capacity`, whose tests re-derive every figure below
from its sources.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field

from calculet.daemon.package.manifest import Architecture, ChipMemoryDecl, KVDecl, MemoryDecl, Topology
from calculet.daemon.package.param_count import param_count

GIB = 1 << 30
MIB = 1 << 20

# docs/sources.md 003 §7: the logical DRAM / SRAM reservation of the model, the same virtual address
# plan applied to each chip (chip masks 1 and 2). It holds params + KV + workspace.
QWEN3_DRAM_RESERVED_PER_CHIP = 15_113_064_448
QWEN3_SRAM_RESERVED_PER_CHIP = 17_662_336
# docs/sources.md 003 §8: one full-context lane (40,960 tokens) of BF16 KV, split over 2 chips by KV head.
QWEN3_KV_ONE_LANE_PER_CHIP = 2_013_265_920


@dataclass(frozen=True)
class ModelPreset:
    """Geometry and per-chip memory of one model as compiled for a board.

    Attributes:
        name: preset name as `calctl capacity --preset` spells it.
        architecture: transformer geometry.
        topology: chips, masks and parallelism of the calbin.
        kv_dtype: KV cache element type (`bf16`, ...).
        kv_split: how KV is divided over chips (`kv_heads`: each chip holds kv_heads / chips heads).
        kv_bytes_per_token: board-wide KV bytes per lane-token
            (layers x kv_heads x 2 x head_dim x dtype bytes).
        calbin_context: tokens a sequence may hold in the compiled graphs.
        lanes: KV lanes the calbin was compiled for (its decode batch).
        chips: per-chip params DRAM/SRAM and workspace (bytes).
        param_file_bytes: sizes of `param_blk{chip}.bin`, one per chip (DRAM + SRAM params close exactly).
        sources: where each figure comes from.
    """

    name: str
    architecture: Architecture
    topology: Topology
    kv_dtype: str
    kv_split: str
    kv_bytes_per_token: int
    calbin_context: int
    lanes: int
    chips: tuple[ChipMemoryDecl, ...]
    param_file_bytes: tuple[int, ...]
    sources: Mapping[str, str] = field(default_factory=dict)

    def kv_decl(self, lanes: int | None = None, lane_context: int | None = None, layout: str = "lane-major") -> KVDecl:
        """The manifest `kv` section for `lanes` lanes of `lane_context` tokens (defaults: as compiled)."""
        return KVDecl(
            dtype=self.kv_dtype,
            layout=layout,
            lanes=self.lanes if lanes is None else lanes,
            lane_context=self.calbin_context if lane_context is None else lane_context,
            bytes_per_token=self.kv_bytes_per_token,
            split=self.kv_split,
        )

    def memory_decl(self, lanes: int | None = None, lane_context: int | None = None) -> MemoryDecl:
        """The manifest `memory` section; `device_memory_required_bytes` is the board-wide DRAM need:
        the sum over chips of params DRAM + workspace + this chip's KV share for `lanes` x `lane_context`
        (the rule the validator's `memory.inconsistent` check applies)."""
        n = self.lanes if lanes is None else lanes
        ctx = self.calbin_context if lane_context is None else lane_context
        per_chip_token = -(-self.kv_bytes_per_token // self.topology.chips)
        kv = n * ctx * per_chip_token if self.kv_split == "kv_heads" else n * ctx * self.kv_bytes_per_token
        required = sum(c.param_dram_bytes + c.workspace_bytes + kv for c in self.chips)
        return MemoryDecl(chips=self.chips, device_memory_required_bytes=required)


def _qwen3_chip(chip: int, param_dram: int) -> ChipMemoryDecl:
    return ChipMemoryDecl(
        chip=chip,
        chip_mask=1 << chip,
        param_dram_bytes=param_dram,
        param_sram_bytes=15_079_424,  # docs/sources.md 003 §6: SRAM-window params, both chips
        workspace_bytes=QWEN3_DRAM_RESERVED_PER_CHIP - param_dram - QWEN3_KV_ONE_LANE_PER_CHIP,
    )


QWEN3_30B_A3B = ModelPreset(
    name="qwen3-30b-a3b",
    architecture=Architecture(
        family="qwen3_moe",
        layers=48,
        hidden_size=2048,
        q_heads=32,
        kv_heads=4,
        head_dim=128,
        experts=128,
        experts_per_token=8,
        expert_intermediate=768,
        vocab_size=151_936,
        rope_theta=1_000_000.0,
        rms_norm_eps=1e-6,
    ),
    topology=Topology(chips=2, chip_masks=(0x1, 0x2), parallelism="tp"),
    kv_dtype="bf16",
    kv_split="kv_heads",
    kv_bytes_per_token=98_304,
    calbin_context=40_960,
    lanes=1,
    chips=(_qwen3_chip(0, 9_389_477_888), _qwen3_chip(1, 8_767_148_032)),
    param_file_bytes=(9_404_557_312, 8_782_227_456),
    sources={
        "architecture": "docs/sources.md 001 §5 (48 layers, hidden 2048, 32 Q / 4 KV heads, head dim 128, "
        "128 experts, 8 active, expert intermediate 768, vocab 151936, RoPE theta 1e6)",
        "rms_norm_eps": "not in docs/sources.md; Qwen3-30B-A3B config.json value 1e-6",
        "calbin_context": "docs/sources.md 001 §5 / 003 §8: 40960, batch 1",
        "kv_bytes_per_token": "docs/sources.md 003 §8: 48 x 4 x 2 x 128 x 2 B = 98304 B",
        "param_dram_bytes": "docs/sources.md 003 §6: memory-reservation segments, chip0 9389477888, chip1 8767148032",
        "param_sram_bytes": "docs/sources.md 003 §6: SRAM window 15079424 B per chip",
        "param_file_bytes": "docs/sources.md 003 §6: param_blk0.bin 9404557312, param_blk1.bin 8782227456",
        "workspace_bytes": "docs/sources.md 003 §7 DRAM reserved 15113064448 B per chip minus params DRAM minus "
        "one lane's KV share 2013265920 B (section 8); chip0 3710320640 B matches section 9's ~3.456 GiB "
        "prefill activation region",
    },
)

# Today's calbin itself (`build-sim --preset qwen3-30b-a3b-b1`): the same model as compiled, batch 1,
# one lane of 40,960 tokens, so `calctl capacity --preset` plans it under the name it is built by.
QWEN3_30B_A3B_B1 = dataclasses.replace(QWEN3_30B_A3B, name="qwen3-30b-a3b-b1")

# The calsim `tiny` package (numeric kernel). `calctl package build-sim --preset tiny` builds its
# architecture from this one (vocab from the trained tokenizer, 512); the memory figures are those a
# build wrote on 2026-11-29, and a built package's own manifest stays authoritative for capacity.
TINY = ModelPreset(
    name="tiny",
    architecture=Architecture(
        family="qwen3_moe",
        layers=2,
        hidden_size=64,
        q_heads=4,
        kv_heads=2,
        head_dim=16,
        experts=8,
        experts_per_token=2,
        expert_intermediate=32,
        vocab_size=512,
        rope_theta=1_000_000.0,
        rms_norm_eps=1e-6,
    ),
    topology=Topology(chips=2, chip_masks=(0x1, 0x2), parallelism="tp"),
    kv_dtype="bf16",
    kv_split="kv_heads",
    kv_bytes_per_token=256,  # 2 x 2 x 2 x 16 x 2 B
    calbin_context=256,
    lanes=4,
    chips=(
        ChipMemoryDecl(chip=0, chip_mask=0x1, param_dram_bytes=448_000, param_sram_bytes=0, workspace_bytes=MIB),
        ChipMemoryDecl(chip=1, chip_mask=0x2, param_dram_bytes=316_928, param_sram_bytes=0, workspace_bytes=MIB),
    ),
    param_file_bytes=(448_000, 316_928),
    sources={"all": "stand-in copied from a built tiny package; its manifest is authoritative"},
)

# Qwen3-4B, dense, compiled (hypothetically: no such calbin exists yet) for one chip in BF16. Its
# shape is the published config.json's; its memory figures are derived, each ASSUMPTION stated.
QWEN3_4B_ARCHITECTURE = Architecture(
    family="qwen3",
    layers=36,
    hidden_size=2560,
    q_heads=32,
    kv_heads=8,
    head_dim=128,
    experts=0,
    experts_per_token=0,
    expert_intermediate=0,
    vocab_size=151_936,
    rope_theta=1_000_000.0,
    rms_norm_eps=1e-6,
    intermediate_size=9728,
    tied_embeddings=True,
)
QWEN3_4B_PARAM_BYTES = 2 * param_count(QWEN3_4B_ARCHITECTURE).stored  # BF16: 2 B per weight
QWEN3_SRAM_WINDOW = 15_079_424  # docs/sources.md 003 §6: the SRAM-window params of each A3B chip
# docs/sources.md 003 §9: A3B chip 0's workspace, ~3.456 GiB of prefill activations at hidden 2048.
QWEN3_A3B_WORKSPACE_CHIP0 = QWEN3_DRAM_RESERVED_PER_CHIP - 9_389_477_888 - QWEN3_KV_ONE_LANE_PER_CHIP
QWEN3_4B_WORKSPACE = QWEN3_A3B_WORKSPACE_CHIP0 * QWEN3_4B_ARCHITECTURE.hidden_size // 2048

QWEN3_4B = ModelPreset(
    name="qwen3-4b",
    architecture=QWEN3_4B_ARCHITECTURE,
    topology=Topology(chips=1, chip_masks=(0x1,), parallelism="none"),
    kv_dtype="bf16",
    kv_split="kv_heads",
    kv_bytes_per_token=147_456,
    calbin_context=40_960,
    lanes=1,
    chips=(
        ChipMemoryDecl(
            chip=0,
            chip_mask=0x1,
            param_dram_bytes=QWEN3_4B_PARAM_BYTES - QWEN3_SRAM_WINDOW,
            param_sram_bytes=QWEN3_SRAM_WINDOW,
            workspace_bytes=QWEN3_4B_WORKSPACE,
        ),
    ),
    param_file_bytes=(QWEN3_4B_PARAM_BYTES,),
    sources={
        "architecture": "Qwen3-4B config.json: 36 layers, hidden 2560, FFN 9728, 32 Q / 8 KV heads of 128, "
        "vocab 151936, tied embeddings, RoPE theta 1e6, RMSNorm eps 1e-6, max position 40960",
        "calbin_context": "Qwen3-4B native context 40960 (the same as the A3B calbin's)",
        "kv_bytes_per_token": "36 x 8 x 2 x 128 x 2 B (BF16) = 147456 B, all on the one chip",
        "param_file_bytes": f"{param_count(QWEN3_4B_ARCHITECTURE).stored:,} weights (param_count) x 2 B BF16",
        "param_sram_bytes": "ASSUMPTION: the compiler fills the same SRAM window as for A3B, 15079424 B "
        "(docs/sources.md 003 §6); the rest of the weights are in DRAM",
        "workspace_bytes": "ASSUMPTION: A3B chip 0's workspace (docs/sources.md 003 §7, §9, prefill "
        "activations of a 40960-token bucket) scaled by hidden size, x 2560 / 2048",
        "topology": "ASSUMPTION: chip mask 0x1 (chip 0); a build for chip 1 would differ only in the mask",
    },
)

PRESETS: Mapping[str, ModelPreset] = {p.name: p for p in (QWEN3_30B_A3B, QWEN3_30B_A3B_B1, QWEN3_4B, TINY)}
