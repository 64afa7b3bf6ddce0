"""Configure-time checks: can calsim run this package? Builds the `SubmodelInfo` map.

Data flow: `CalsimDevice.configure` -> `build_submodels(manifest)` + `check_timing(manifest)`
before any memory is reserved or any kernel built. calsim feeds exactly the I/O the contract
names: inputs `tokens` and `positions` (int32 `[batch, max_tokens]`), outputs those of the
package's logits output mode (`package/logits_output.py`: `logits` bf16 `[batch, vocab]`, or a
topk package's decode outputs); a package declaring anything else cannot run here
(ConfigurationError).
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from calculet.daemon.device.errors import ConfigurationError
from calculet.daemon.device.types import SubmodelInfo, TaskType, TensorSpec
from calculet.daemon.package.logits_output import LogitsOutput, output_tensors
from calculet.daemon.package.manifest import PackageManifest, SubmodelDecl
from calculet.daemon.package.rules_model import decode_curve_problems

NUMPY_DTYPES: dict[str, np.dtype] = {
    "int32": np.dtype(np.int32),
    "uint32": np.dtype(np.uint32),
    "bf16": np.dtype(ml_dtypes.bfloat16),
    "fp16": np.dtype(np.float16),
    "fp32": np.dtype(np.float32),
    "int8": np.dtype(np.int8),
    "uint8": np.dtype(np.uint8),
}

INPUT_NAMES = ("tokens", "positions")


def _expected_io(
    decl: SubmodelDecl, vocab: int, logits: LogitsOutput
) -> tuple[dict[str, TensorSpec], dict[str, TensorSpec]]:
    rows = (decl.batch, decl.max_tokens)
    inputs = {n: TensorSpec(n, rows, "int32") for n in INPUT_NAMES}
    wanted = output_tensors(decl.role, decl.batch, vocab, logits)
    outputs = {n: TensorSpec(n, shape, dtype) for n, (shape, dtype) in wanted.items()}
    return inputs, outputs


def _submodel(decl: SubmodelDecl, vocab: int, pkg: str, logits: LogitsOutput) -> SubmodelInfo:
    where = f"package {pkg!r} submodel {decl.name!r}"
    try:
        task = TaskType(decl.role)
    except ValueError:
        raise ConfigurationError(f"{where}: role {decl.role!r} is not prefill or decode") from None
    if decl.batch < 1 or decl.max_tokens < 1:
        raise ConfigurationError(f"{where}: batch and max_tokens must be >= 1")
    if task is TaskType.DECODE and decl.max_tokens != 1:
        raise ConfigurationError(f"{where}: a decode submodel feeds 1 token per row, not {decl.max_tokens}")
    want_in, want_out = _expected_io(decl, vocab, logits)
    for kind, declared, wanted in (
        ("inputs", decl.inputs, want_in),
        ("outputs", decl.outputs, want_out),
    ):
        got = {t.name: TensorSpec(t.name, tuple(t.shape), t.dtype) for t in declared}
        if got != wanted or len(declared) != len(wanted):
            raise ConfigurationError(
                f"{where}: {kind} {sorted(got.values(), key=lambda s: s.name)} do not match what calsim "
                f"feeds {sorted(wanted.values(), key=lambda s: s.name)}"
            )
    return SubmodelInfo(
        name=decl.name,
        task_type=task,
        batch=decl.batch,
        max_tokens=decl.max_tokens,
        inputs=tuple(want_in[n] for n in INPUT_NAMES),
        outputs=tuple(want_out.values()),
    )


def build_submodels(manifest: PackageManifest) -> dict[str, SubmodelInfo]:
    """Exact name -> SubmodelInfo for every submodel of `manifest`.

    Raises:
        ConfigurationError: duplicate names, unknown role, decode with max_tokens != 1, I/O that
            differs from tokens/positions/logits, or bad KV/vocab geometry.
    """
    vocab = manifest.architecture.vocab_size
    if vocab < 1 or manifest.kv.lanes < 1 or manifest.kv.lane_context < 1:
        raise ConfigurationError(f"package {manifest.name!r}: vocab, lanes and lane_context must be >= 1")
    if manifest.kv.bytes_per_token < 0:
        raise ConfigurationError(f"package {manifest.name!r}: kv.bytes_per_token must be >= 0")
    out: dict[str, SubmodelInfo] = {}
    for decl in manifest.submodels:
        if decl.name in out:
            raise ConfigurationError(f"package {manifest.name!r}: two submodels named {decl.name!r}")
        out[decl.name] = _submodel(decl, vocab, manifest.name, manifest.logits_output)
    if not out:
        raise ConfigurationError(f"package {manifest.name!r}: no submodels")
    return out


def check_timing(manifest: PackageManifest) -> None:
    """The timing model must be usable: finite, non-negative figures, positive bandwidths, and a
    decode curve the validator accepts (`decode_curve_problems`: 2+ points, contexts strictly
    increasing, finite ms > 0, non-decreasing, reaching the package context).

    Raises:
        ConfigurationError: naming the first bad field.
    """
    t = manifest.timing
    fields = {
        "prefill_fixed_ms": t.prefill_fixed_ms,
        "prefill_ms_per_token": t.prefill_ms_per_token,
        "batch_alpha": t.batch_alpha,
    }
    for name, value in fields.items():
        if not (math.isfinite(value) and value >= 0):
            raise ConfigurationError(f"package {manifest.name!r}: timing.{name} must be finite and >= 0")
    for name, value in {"h2d_gbps": t.h2d_gbps, "d2h_gbps": t.d2h_gbps}.items():
        if not (math.isfinite(value) and value > 0):
            raise ConfigurationError(f"package {manifest.name!r}: timing.{name} must be finite and > 0")
    problems = decode_curve_problems(t.decode_curve, manifest.context)
    if problems:
        code, where, message = problems[0]
        raise ConfigurationError(f"package {manifest.name!r}: timing.{where}: {message} ({code})")
