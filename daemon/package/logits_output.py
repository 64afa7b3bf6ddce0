"""The logits output mode of a package's decode submodels (issue 22; docs/sources.md 003 §12 lists a
sampling output mode among the manifest's fields).

- `full` (the default): each decode row returns its bf16 `[vocab]` logits.
- `topk` with K: each decode row returns its K highest-ranked logits (rank: value descending, id
  ascending) with their ids, the largest logit outside them (`tail_max`) and whether the row held a
  NaN or infinity (`finite`). The full row stays on the device until the job's output buffer is
  reused, and the host reads it on demand (`Submission.read_logits_row`) when the top K cannot
  decide (`daemon/sampling/topk.py`).

Prefill submodels always return full logits (one row per job). `output_tensors` is the one place
that says which output tensors a submodel declares; the validator, calsim and the executor's
buffers all follow it.
"""

from __future__ import annotations

from dataclasses import dataclass

FULL, TOPK = "full", "topk"
MODES = (FULL, TOPK)
TOPK_OUTPUTS = ("topk_ids", "topk_values", "tail_max", "finite")


@dataclass(frozen=True)
class LogitsOutput:
    """Attributes: mode (`full` or `topk`), k (the top-k width; 0 in full mode)."""

    mode: str = FULL
    k: int = 0

    @property
    def topk(self) -> bool:
        return self.mode == TOPK


def output_tensors(role: str, batch: int, vocab: int, out: LogitsOutput) -> dict[str, tuple[tuple[int, ...], str]]:
    """Name -> (shape, dtype) of the outputs a submodel of `role` and `batch` declares."""
    if role == "decode" and out.topk:
        return {
            "topk_ids": ((batch, out.k), "int32"),
            "topk_values": ((batch, out.k), "bf16"),
            "tail_max": ((batch,), "bf16"),
            "finite": ((batch,), "uint8"),
        }
    return {"logits": ((batch, vocab), "bf16")}
