"""`DeviceModel`: what the timing-model limit needs to know of a package, read from its manifest.

Owns the reduction of a `PackageManifest` to plain figures: the calsim timing table (`TimingDecl`:
decode curve, prefill fixed and per-token costs, batch alpha, copy bandwidths), the compiled decode
batches, the KV lanes and context, the cross-chip traffic (`topology.d2d`), and the bytes each copy
moves per token or row — computed the
way calsim's `h2d_bytes` / `d2h_bytes` count them (daemon/calsim/timing.py): H2D moves, of every
input `[batch, max_tokens]`, the row's new tokens only; D2H moves every output of each active row.
Data flow: package directory -> `load_manifest` -> `DeviceModel.from_manifest` -> `limit.py`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from calculet.common.errors import InvalidArgument
from calculet.daemon.package.manifest import (
    D2DDecl,
    PackageManifest,
    SubmodelDecl,
    TensorDecl,
    TimingDecl,
    load_manifest,
)

# Bytes per element of the manifest's dtype names (daemon/package/manifest.py DTYPES).
DTYPE_BYTES = {"int32": 4, "uint32": 4, "bf16": 2, "fp16": 2, "fp32": 4, "int8": 1, "uint8": 1}


@dataclass(frozen=True)
class DeviceModel:
    """A package as the timing model sees it.

    Attributes:
        timing: the calsim timing table.
        decode_batches: compiled decode batches, ascending.
        lanes: KV lanes (sequences that can hold KV at once).
        context: tokens a sequence may hold (prompt + output).
        prefill_h2d_per_token: bytes H2D moves per new prompt token of a prefill row.
        prefill_d2h_per_row: bytes D2H moves per prefill row (the last token's logits).
        decode_h2d_per_row: bytes H2D moves per decode row (its one new token).
        decode_d2h_per_row: bytes D2H moves per decode row (its logits).
        d2d: the package's cross-chip traffic (`topology.d2d`), None when it declares none.
    """

    timing: TimingDecl
    decode_batches: tuple[int, ...]
    lanes: int
    context: int
    prefill_h2d_per_token: int
    prefill_d2h_per_row: int
    decode_h2d_per_row: int
    decode_d2h_per_row: int
    d2d: D2DDecl | None = None

    def __post_init__(self) -> None:
        if not self.decode_batches or list(self.decode_batches) != sorted(set(self.decode_batches)):
            raise InvalidArgument(f"decode batches: need distinct, ascending sizes, got {self.decode_batches}")
        if self.decode_batches[0] < 1 or self.lanes < 1 or self.context < 1:
            raise InvalidArgument("decode batches, lanes and context: must be at least 1")

    @property
    def max_batch(self) -> int:
        return self.decode_batches[-1]

    def batch_for(self, rows: int) -> int:
        """The compiled batch the daemon runs `rows` decode rows on: the smallest that holds them
        (the largest when none does), as `ModelRuntime.decode_submodel_for` chooses."""
        return next((b for b in self.decode_batches if b >= rows), self.max_batch)

    @classmethod
    def from_manifest(cls, manifest: PackageManifest) -> DeviceModel:
        """Raises: InvalidArgument: the package has no prefill or no decode submodel."""
        prefills = manifest.submodels_for("prefill")
        decodes = manifest.submodels_for("decode")
        if not prefills or not decodes:
            raise InvalidArgument(f"package {manifest.name}: needs a prefill and a decode submodel")
        prefill = max(prefills, key=lambda s: s.max_tokens)
        widest = decodes[-1]
        return cls(
            timing=manifest.timing,
            decode_batches=tuple(sorted({s.batch for s in decodes})),
            lanes=manifest.kv.lanes,
            context=manifest.context,
            prefill_h2d_per_token=_per_token(prefill.inputs, prefill),
            prefill_d2h_per_row=_per_row(prefill.outputs, prefill),
            decode_h2d_per_row=_per_token(widest.inputs, widest),
            decode_d2h_per_row=_per_row(widest.outputs, widest),
            d2d=manifest.topology.d2d,
        )

    @classmethod
    def from_package(cls, package_dir: Path) -> DeviceModel:
        """Raises: ManifestError: no readable manifest; InvalidArgument: see `from_manifest`."""
        return cls.from_manifest(load_manifest(package_dir))


def _nbytes(tensor: TensorDecl) -> int:
    return DTYPE_BYTES[tensor.dtype] * math.prod(tensor.shape)


def _per_token(inputs: tuple[TensorDecl, ...], sub: SubmodelDecl) -> int:
    """H2D bytes per new token of one row: each input's whole size over `batch * max_tokens`."""
    return sum(_nbytes(t) // (sub.batch * sub.max_tokens) for t in inputs)


def _per_row(outputs: tuple[TensorDecl, ...], sub: SubmodelDecl) -> int:
    """D2H bytes per active row: each output's whole size over `batch`."""
    return sum(_nbytes(t) // sub.batch for t in outputs)
