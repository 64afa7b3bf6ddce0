"""The `qwen3-4b` preset: Qwen3-4B, dense, BF16, on one chip (docs/sources.md 000 §16 M4).

Owns the mapping from `calculet.daemon.package.presets.QWEN3_4B` into a calsim package for the
synthetic kernel: Qwen3-4B's geometry, the same real Qwen3 tokenizer and chat template as the A3B
preset, a single-chip topology (mask 0x1) that leaves chip 1 free, and a timing table derived
from the A3B measurements (`timing_dense`). Its default lanes and lane context are what fits one
16 GiB chip beside 8 GB of BF16 weights; `calctl capacity --preset qwen3-4b` shows the trade-off.
Like the A3B preset it writes a stand-in, not the 8 GB parameter block.
"""

from __future__ import annotations

from calculet.daemon.package.manifest import Architecture, Compatibility, TimingDecl
from calculet.daemon.package.presets import QWEN3_4B
from calculet.ops.sim_packages.chat_template import QWEN_TEMPLATE_RESOURCE
from calculet.ops.sim_packages.preset import SimPreset, sim_compatibility
from calculet.ops.sim_packages.qwen import (
    CALCC_COMMIT,
    QWEN_TOKENIZER_MAX_LENGTH,
    TVM_COMMIT,
    StandinParamBlocks,
)
from calculet.ops.sim_packages.qwen3_tokenizer import build_qwen3_tokenizer
from calculet.ops.sim_packages.timing_dense import dense_timing
from calculet.ops.sim_packages.tokenizer import TrainedTokenizer

QWEN3_4B_SYNTHETIC_SEED = 4_004


class Qwen3DensePreset(SimPreset):
    """Qwen3-4B on one chip of today's board, served by the synthetic kernel."""

    name = "qwen3-4b"
    package_name = "calsim-qwen3-4b"
    kernel = "synthetic"
    quantization = "bf16"
    context = QWEN3_4B.calbin_context
    prefill_bucket = QWEN3_4B.calbin_context
    # 8 lanes of 3,584 tokens fit the chip (16 would leave 1,792 tokens each; 1 lane 30,464).
    default_decode_batches = (1, 4, 8)
    min_lanes = 1
    model_max_length = QWEN_TOKENIZER_MAX_LENGTH
    seed = QWEN3_4B_SYNTHETIC_SEED
    topology = QWEN3_4B.topology
    chat_template_resource = QWEN_TEMPLATE_RESOURCE

    def tokenizer(self) -> TrainedTokenizer:
        """Qwen3's tokenizer, the same as the A3B preset's.

        Raises:
            FailedPrecondition: `qwen-tokenizer` (the `calculet[sim]` extra) is not installed.
        """
        return build_qwen3_tokenizer()

    def architecture(self, vocab_size: int) -> Architecture:
        """Qwen3-4B's geometry (the tokenizer's smaller vocab is ignored, as for A3B)."""
        return QWEN3_4B.architecture

    def params(self, arch: Architecture) -> StandinParamBlocks:
        return StandinParamBlocks(QWEN3_4B)

    def compatibility(self) -> Compatibility:
        return sim_compatibility(
            {"calcc": CALCC_COMMIT, "tvm": TVM_COMMIT},
        )

    def timing(self) -> TimingDecl:
        return dense_timing(QWEN3_4B)
