"""calsim model packages: `calctl package build-sim` and the Python API behind it.

`build_sim_package(preset, out_dir, ...)` writes a vendor-shaped package directory (param
blocks, prefill/decode stand-in folders, tokenizer folder, `calculet-package.json`) for one of
`PRESETS`: `tiny` (numeric kernel, real tiny weights, tokenizer trained at build time),
`qwen3-30b-a3b` (synthetic kernel, real geometry, memory and timing, stand-in weights),
`qwen3-30b-a3b-b1` (the same as today's batch-1 calbin: one lane, its prefill mislabelled, no
`prefill_at_offset`) or `qwen3-4b` (dense, one chip, timing derived from A3B's; docs/models.md).
See build.py for the data flow.
"""

from calculet.ops.sim_packages.build import PRESETS, build_sim_package

__all__ = ["PRESETS", "build_sim_package"]
