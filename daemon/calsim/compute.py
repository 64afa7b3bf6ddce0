"""The compute step of a job: staged input rows -> kernel -> bf16 logits rows.

Data flow: the worker calls `compute_logits` outside the device lock while it holds the kernel
(the engine's kernel token), with the inputs it copied at H2D time. Positions come from the
`positions` input; a prefill row writes KV positions past_kv_len..past_kv_len+n-1 of its lane.
A bad token id or a `ValueError` from the kernel is what a real runtime reports as a CCU
exception: the job fails, it does not crash the device.
"""

from __future__ import annotations

from collections.abc import Mapping

import ml_dtypes
import numpy as np

from calculet.common.errors import CalculetError, ErrorKind
from calculet.daemon.calsim.kernel import DecodeRow, Kernel
from calculet.daemon.device.types import RowSpec, TaskType
from calculet.daemon.sampling.topk import device_topk


class ComputeFailed(CalculetError):
    """The job cannot be computed (bad token id, kernel refused it); it ends as CCU_EXCEPTION.
    Internal to calsim: the engine turns it into the job's failure, never raises it to callers."""

    kind = ErrorKind.ABORTED


def compute_logits(
    kernel: Kernel, task: TaskType, rows: tuple[RowSpec, ...], staged: Mapping[str, np.ndarray]
) -> np.ndarray:
    """Run one job's rows through `kernel`.

    Args:
        kernel: the model's kernel; the caller holds it exclusively.
        task: prefill (one kernel call per row) or decode (one call for all rows).
        rows: the job's rows; row i uses row i of `staged["tokens"]` / `staged["positions"]`; a
            masked row (fixed slots) is not computed and gets zero logits.
        staged: int32 input rows read at H2D time.

    Returns:
        bf16 `[len(rows), vocab]` logits.

    Raises:
        ComputeFailed: a token id outside 0..vocab-1, or the kernel raised ValueError.
    """
    tokens, positions = staged["tokens"], staged["positions"]
    active = [(i, r) for i, r in enumerate(rows) if not r.is_masked]  # a masked row computes nothing
    for i, row in active:
        fed = tokens[i, : row.cur_seq_len]
        if fed.size and (int(fed.min()) < 0 or int(fed.max()) >= kernel.vocab_size):
            raise ComputeFailed(f"row {i}: token id outside 0..{kernel.vocab_size - 1}")
    try:
        if task is TaskType.PREFILL:
            computed = np.stack(
                [
                    kernel.prefill(r.lane, r.past_kv_len, tokens[i, : r.cur_seq_len], positions[i, : r.cur_seq_len])
                    for i, r in active
                ]
            )
        else:
            computed = kernel.decode(
                [DecodeRow(r.lane, r.past_kv_len, int(tokens[i, 0]), int(positions[i, 0])) for i, r in active]
            )
    except ValueError as exc:
        raise ComputeFailed(f"kernel refused the job: {exc}") from exc
    out = np.asarray(computed, dtype=np.float32)
    if len(active) < len(rows):  # fixed slots: a masked row's logits are zeros, which nobody reads
        full = np.zeros((len(rows), out.shape[1]), dtype=np.float32)
        full[[i for i, _ in active]] = out
        out = full
    return out.astype(ml_dtypes.bfloat16)


def topk_outputs(logits: np.ndarray, k: int) -> dict[str, np.ndarray]:
    """What a top-k decode job copies back for its bf16 `logits` rows (`package/logits_output.py`):
    each row's top K ids (int32) and values (bf16), the tail's maximum (bf16) and a finite flag
    (uint8), as `sampling.topk.device_topk` defines them."""
    top = device_topk(logits, k)
    return {
        "topk_ids": top.ids.astype(np.int32),
        "topk_values": top.values.astype(ml_dtypes.bfloat16),
        "tail_max": top.tail_max.astype(ml_dtypes.bfloat16),
        "finite": top.finite.astype(np.uint8),
    }
