"""The `qwen3-30b-a3b-b1` preset: today's production calbin as docs/sources.md describes it.

Owns what sets this calbin apart from the `qwen3-30b-a3b` preset, whose geometry, memory figures,
tokenizer, chat template and timing it shares (the timing figures were measured on this calbin,
docs/sources.md 001 §10):

- batch 1 only: one decode submodel of batch 1 and one KV lane of the full 40,960-token context
  (docs/sources.md 001 §1, §5, 003 §5, §8): one sequence on the board at a time, which is also
  what today's one backing vector for all slots allows (001 §9, P0 throughput);
- the submodels are named `prefill` and `decode` as in docs/sources.md 003 §5's table, and the
  prefill carries the vendor's wrong label `smodel_type: llm_decode` (001 §9 P0.7, 003 §12); its
  tokens/positions are `[1, 40960]`, so a prompt of up to 40,960 tokens is one prefill job;
- no `prefill_at_offset` declaration: docs/sources.md never says this calbin computes a prefill
  after a non-zero `past_kv_len` correctly (000 §5.3 allows splitting a prompt only where it does), so the
  package declares nothing and the daemon must not chunk prompts or reuse prefixes on it;
- the compatibility matrix is what CalRT 0.7.6 allows: runtime 0.7.6 (the build links
  `libcalrt-linux-x86_64.so.0.7.6`, 001 §3), a driver before 1.0.0, one configured calbin at a
  time (000 §9, §17: co-residency needs driver 1.0.0, for which this calbin was never qualified).
"""

from __future__ import annotations

from calculet.daemon.package.manifest import Compatibility, CompatRow
from calculet.ops.sim_packages.qwen import CALCC_COMMIT, TVM_COMMIT, QwenPreset
from calculet.ops.sim_packages.submodels import VENDOR_DECODE_LABEL

B1_RUNTIME = ">=0.7.6,<0.7.7"  # docs/sources.md 001 §3: CalRT 0.7.6 exactly
B1_DRIVER = ">=0.7.6,<1.0"  # docs/sources.md 000 §9, §17: the driver of today's board
B1_MATRIX = (CompatRow(runtime=B1_RUNTIME, driver=B1_DRIVER, firmware="*", co_resident=False),)


class QwenB1Preset(QwenPreset):
    """Qwen3-30B-A3B as today's batch-1 calbin (see the module docstring)."""

    name = "qwen3-30b-a3b-b1"
    package_name = "calsim-qwen3-30b-a3b-b1"
    default_decode_batches = (1,)
    only_decode_batches = (1,)
    max_lanes = 1
    prefill_label = VENDOR_DECODE_LABEL  # docs/sources.md 003 §12: the vendor's mislabel, kept
    prefill_at_offset = None

    def decode_name(self, batch: int) -> str:
        """`decode`: the calbin has one decode submodel (docs/sources.md 003 §5)."""
        return "decode"

    def compatibility(self) -> Compatibility:
        return Compatibility(
            runtime=B1_RUNTIME,
            driver=B1_DRIVER,
            compiler={"calcc": CALCC_COMMIT, "tvm": TVM_COMMIT},
            matrix=B1_MATRIX,
        )
