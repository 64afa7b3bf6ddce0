"""The parallelism variants of a calsim package, for the A/B of docs/sources.md 000 §11 (M6):
`calctl package build-sim --parallelism FORM` builds the same model declaring another split over
the two chips, with the cross-chip traffic that split implies (`topology.d2d`), so `calctl bench
compare` can run the same workload on both.

What calsim models is only the link: every variant computes at the measured pace of today's
tensor-parallel board (ops/sim_packages/timing.py; ASSUMPTION: an EP calbin's compute per token
equals TP's, no expert load imbalance) and pays `topology.d2d` on top. So is its traffic estimated
for the model that timing stands for, Qwen3-30B-A3B (docs/sources.md 001 §5: 48 layers, hidden
2048, 8 of 128 experts per token), BF16 activations (2 B), 2 chips:

- `tp` (today's split, C0): every layer reduces the attention output and the MoE output over the
  chips: 2 x hidden x 2 B = 8 KiB a layer, 393,216 B a token; 146 synchronisations a job (the
  cross-chip sync ops counted in today's graphs, docs/sources.md 001 §5).
- `ep` (C3): attention replicated on both chips, the experts split; after the router a token goes
  to its 8 experts, half of them on the other chip, and comes back: 2 x 4 x hidden x 2 B = 32 KiB
  a layer, 1,572,864 B a token; 2 all-to-alls a layer, 96 synchronisations a job.
- `tp+ep`: attention tensor parallel (one reduce a layer) and the experts split (two all-to-alls):
  36 KiB a layer, 1,769,472 B a token; 144 synchronisations a job.

So EP moves 4x TP's bytes with a third fewer synchronisations: it wins where jobs are small (a
decode step of a small batch: the syncs dominate) and loses where they carry many tokens (long
prefills, batch 16), which only a measurement on the workload decides. Pipeline parallel (`pp`)
is not offered: its stages run serially and leave bubbles, which calsim's compute does not model.
"""

from __future__ import annotations

import dataclasses

from calculet.common.errors import InvalidArgument
from calculet.daemon.package.manifest import D2DDecl, Topology
from calculet.daemon.package.presets import QWEN3_30B_A3B

ACTIVATION_BYTES = 2  # BF16
_ARCH = QWEN3_30B_A3B.architecture
_TOKEN_LAYER = _ARCH.hidden_size * ACTIVATION_BYTES  # one token's activations at one layer
_REMOTE_EXPERTS = _ARCH.experts_per_token // 2  # of 8 experts, half on the other chip
TODAY_SYNCS = 146  # docs/sources.md 001 §5: cross-chip sync ops of each of today's graphs

# form -> (bytes per token, syncs per job), from the module docstring's derivations.
TRAFFIC: dict[str, tuple[int, int]] = {
    "tp": (_ARCH.layers * 2 * _TOKEN_LAYER, TODAY_SYNCS),
    "ep": (_ARCH.layers * 2 * _REMOTE_EXPERTS * _TOKEN_LAYER, _ARCH.layers * 2),
    "tp+ep": (_ARCH.layers * (1 + 2 * _REMOTE_EXPERTS) * _TOKEN_LAYER, _ARCH.layers * 3),
}


def with_parallelism(topology: Topology, form: str) -> Topology:
    """`topology` declaring `form` and its estimated cross-chip traffic.

    Raises:
        InvalidArgument: `form` is not one of `TRAFFIC`, or the topology has one chip.
    """
    if form not in TRAFFIC:
        raise InvalidArgument(f"parallelism {form!r}: calsim builds {', '.join(TRAFFIC)} (pp: stages not modelled)")
    if topology.chips < 2:
        raise InvalidArgument(f"parallelism {form!r} needs several chips; this preset runs on {topology.chips}")
    nbytes, syncs = TRAFFIC[form]
    return dataclasses.replace(topology, parallelism=form, d2d=D2DDecl(nbytes, syncs))
