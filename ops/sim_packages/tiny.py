"""The `tiny` preset: a real (tiny) Qwen3-MoE-shaped model for calsim's numeric kernel.

Owns the tiny geometry and its weights: `generate_tiny_weights(arch, seed)` makes the full
float32 weights, `split_for_chips` cuts them tensor-parallel for the 2 chips, and
`save_param_block` writes `param_blk0.bin` / `param_blk1.bin`. The memory figures are the real
byte counts of each chip's tensors plus a small workspace, so capacity checks on the tiny
package exercise the same arithmetic as on the real one.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from calculet.daemon.calsim.kernels.weights import (
    generate_tiny_weights,
    param_block_name,
    save_param_block,
    split_for_chips,
)
from calculet.daemon.package.manifest import Architecture, ChipMemoryDecl, Compatibility
from calculet.daemon.package.presets import TINY
from calculet.ops.sim_packages.preset import BOARD_TOPOLOGY, ParamBlocks, SimPreset, sim_compatibility
from calculet.ops.sim_packages.writer import PackageWriter

TINY_CONTEXT = 256
# ASSUMPTION: generous for numpy activations of a 256-token prefill at hidden 64 / vocab 512
# (256 x 512 x 4 B = 512 KiB for the widest intermediate).
TINY_WORKSPACE_BYTES = 1 << 20
TINY_SEED = 20260802


class TinyParamBlocks(ParamBlocks):
    """The tiny model's two chip blocks, held in memory until written.

    Args:
        blocks: per-chip name -> float32 tensor, as `split_for_chips` returns them (owned here).
        workspace_bytes: declared workspace per chip.
    """

    def __init__(self, blocks: tuple[dict[str, np.ndarray], ...], workspace_bytes: int) -> None:
        self._blocks = blocks
        self._memory = tuple(
            ChipMemoryDecl(
                chip=chip,
                chip_mask=1 << chip,
                param_dram_bytes=sum(int(t.nbytes) for t in block.values()),
                param_sram_bytes=0,
                workspace_bytes=workspace_bytes,
            )
            for chip, block in enumerate(blocks)
        )

    @property
    def memory(self) -> tuple[ChipMemoryDecl, ...]:
        return self._memory

    @property
    def file_role(self) -> str:
        # Numeric weights in npz form, not a vendor param block: the figures are the tensors'
        # byte counts, so the file (with its archive headers) does not close with them.
        return "weights"

    def write(self, writer: PackageWriter) -> None:
        for chip, block in enumerate(self._blocks):
            name = param_block_name(chip)
            save_param_block(writer.path(name), block)
            writer.adopt(name, self.file_role)


class TinyPreset(SimPreset):
    """2 layers, hidden 64, 4 q / 2 kv heads of 16, 8 experts (top-2) of 32, vocab from the tokenizer."""

    name = "tiny"
    package_name = "calsim-tiny"
    kernel = "numeric"
    quantization = "fp32"
    context = TINY_CONTEXT
    prefill_bucket = TINY_CONTEXT
    default_decode_batches = (1, 4)
    min_lanes = 4
    model_max_length = TINY_CONTEXT
    seed = TINY_SEED
    topology = BOARD_TOPOLOGY

    def architecture(self, vocab_size: int) -> Architecture:
        # The geometry lives once, in the capacity planner's preset; the tokenizer sets the vocab.
        return dataclasses.replace(TINY.architecture, vocab_size=vocab_size)

    def params(self, arch: Architecture) -> TinyParamBlocks:
        blocks = split_for_chips(generate_tiny_weights(arch, self.seed), arch)
        return TinyParamBlocks(blocks, TINY_WORKSPACE_BYTES)

    def compatibility(self) -> Compatibility:
        return sim_compatibility(
            {
                "builder": "calctl package build-sim",
                "weights": f"generate_tiny_weights seed {self.seed}",
            },
        )
