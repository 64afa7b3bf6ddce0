"""Submodel declarations of the calsim packages: one prefill bucket and one decode per batch.

Owns the I/O contract the emulated calbin declares (docs/sources.md 003 §5): prefill takes tokens
and positions as int32 `[1, bucket]` and returns the last token's bf16 logits `[1, vocab]`;
decode batch B takes int32 `[B, 1]` and returns bf16 `[B, vocab]`. Names are exact (`prefill`,
`decode_b{B}`) and `smodel_type` is correct for the role, unless a preset reproduces the vendor's
mislabelled prefill (`llm_decode`, docs/sources.md 001 §9, 003 §12: `qwen3-30b-a3b-b1`, whose
decode is named `decode` as the seed calbin's). CSR registers follow 003 §5's offsets, one uint32
per row.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from calculet.daemon.package.logits_output import LogitsOutput, output_tensors
from calculet.daemon.package.manifest import SubmodelDecl, TensorDecl

CSR_CUR_SEQ_LEN = 0x1104  # docs/sources.md 003 §5
CSR_PAST_KV_CUR_SEQ_LEN = 0x1144
CSR_ROW_STRIDE = 4
# cur_seq_len[i] registers sit between 0x1104 and 0x1144: room for 16 rows.
MAX_DECODE_BATCH = (CSR_PAST_KV_CUR_SEQ_LEN - CSR_CUR_SEQ_LEN) // CSR_ROW_STRIDE
PREFILL_LABEL = "llm_prefill"  # the vendor `smodel_type` a correct prefill carries
VENDOR_DECODE_LABEL = "llm_decode"  # ... and a decode (also today's prefill, docs/sources.md 003 §12)


def decode_name(batch: int) -> str:
    return f"decode_b{batch}"


def _csr(rows: int) -> dict[str, str]:
    csr: dict[str, str] = {}
    for i in range(rows):
        csr[f"cur_seq_len[{i}]"] = hex(CSR_CUR_SEQ_LEN + CSR_ROW_STRIDE * i)
    for i in range(rows):
        csr[f"past_kv_cur_seq_len[{i}]"] = hex(CSR_PAST_KV_CUR_SEQ_LEN + CSR_ROW_STRIDE * i)
    return csr


def prefill_submodel(
    bucket: int, context: int, vocab_size: int, at_offset: bool | None = True, smodel_type: str = PREFILL_LABEL
) -> SubmodelDecl:
    """The prefill submodel: up to `bucket` tokens of one sequence per job, after any `past_kv_len`
    (calsim's kernels attend over the lane's KV below the offset): `at_offset` is what it declares
    (None: undeclared, as a package built before the field); `smodel_type` the vendor label."""
    return SubmodelDecl(
        name="prefill",
        role="prefill",
        smodel_type=smodel_type,
        batch=1,
        max_tokens=bucket,
        context=context,
        folder="prefill",
        inputs=(TensorDecl("tokens", (1, bucket), "int32"), TensorDecl("positions", (1, bucket), "int32")),
        outputs=(TensorDecl("logits", (1, vocab_size), "bf16"),),
        csr=_csr(1),
        prefill_at_offset=at_offset,
    )


def decode_submodel(
    batch: int, context: int, vocab_size: int, logits_output: LogitsOutput | None = None, name: str | None = None
) -> SubmodelDecl:
    """A decode submodel: one token for each of `batch` rows (distinct lanes) per job; its outputs
    those of the package's logits output mode (full logits by default); named `decode_b{batch}`
    unless `name` is given."""
    name = name or decode_name(batch)
    outputs = output_tensors("decode", batch, vocab_size, logits_output or LogitsOutput())
    return SubmodelDecl(
        name=name,
        role="decode",
        smodel_type=VENDOR_DECODE_LABEL,
        batch=batch,
        max_tokens=1,
        context=context,
        folder=name,
        inputs=(TensorDecl("tokens", (batch, 1), "int32"), TensorDecl("positions", (batch, 1), "int32")),
        outputs=tuple(TensorDecl(n, shape, dtype) for n, (shape, dtype) in outputs.items()),
        csr=_csr(batch),
    )


def all_submodels(
    bucket: int,
    context: int,
    vocab_size: int,
    decode_batches: Sequence[int],
    logits_output: LogitsOutput | None = None,
    prefill_at_offset: bool | None = True,
    prefill_label: str = PREFILL_LABEL,
    decode_names: Callable[[int], str] = decode_name,
) -> tuple[SubmodelDecl, ...]:
    """Prefill first, then decode submodels by ascending batch (`decode_names(batch)` names them;
    `prefill_label` is the prefill's vendor `smodel_type`)."""
    decodes = tuple(
        decode_submodel(b, context, vocab_size, logits_output, decode_names(b)) for b in sorted(decode_batches)
    )
    return (prefill_submodel(bucket, context, vocab_size, prefill_at_offset, prefill_label), *decodes)
