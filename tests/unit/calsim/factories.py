"""Small factories for the calsim device tests: a manifest, a fake kernel, job buffers.

The fake kernel implements the `Kernel` ABC with logits that are an exact function of the
lane's stored KV tokens and positions (`reference_logits`), so a job that read the wrong lane,
the wrong input data or a cleared/corrupted lane produces different logits.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from calculet.daemon.calsim.device import CalsimDevice, CalsimModel
from calculet.daemon.calsim.engine import POISON_BYTE
from calculet.daemon.calsim.kernel import DecodeRow, Kernel
from calculet.daemon.device.api import HostBuffer
from calculet.daemon.device.types import JobSpec, RowSpec
from calculet.daemon.package.manifest import (
    Architecture,
    ChipMemoryDecl,
    Compatibility,
    DecodePoint,
    GoldenDecl,
    KVDecl,
    MemoryDecl,
    PackageManifest,
    SubmodelDecl,
    TensorDecl,
    TimingDecl,
    TokenizerDecl,
    Topology,
)

VOCAB = 64
LANES = 4
LANE_CONTEXT = 64
BUCKET = 16
PREFILL = "prefill_b1_t16"
DECODE1 = "decode_b1"
DECODE4 = "decode_b4"
KV_BYTES_PER_TOKEN = 256
PARAM_DRAM = 1 << 20
PARAM_SRAM = 4096
WORKSPACE = 1 << 16

TIMING = TimingDecl(
    decode_curve=(DecodePoint(0, 2.0), DecodePoint(LANE_CONTEXT, 10.0)),
    prefill_fixed_ms=3.0,
    prefill_ms_per_token=0.5,
    batch_alpha=0.25,
    h2d_gbps=1e-4,  # slow copies so that H2D/D2H are visible on the modelled timeline
    d2h_gbps=2e-4,
)


def _submodel(name: str, role: str, batch: int, tokens: int) -> SubmodelDecl:
    return SubmodelDecl(
        name=name,
        role=role,
        smodel_type=f"llm_{role}",
        batch=batch,
        max_tokens=tokens,
        context=LANE_CONTEXT,
        folder=name,
        inputs=(
            TensorDecl("tokens", (batch, tokens), "int32"),
            TensorDecl("positions", (batch, tokens), "int32"),
        ),
        outputs=(TensorDecl("logits", (batch, VOCAB), "bf16"),),
    )


def make_manifest(name: str = "tiny", **overrides: Any) -> PackageManifest:
    """vocab 64, 2 chips, 4 lanes of 64 tokens, prefill bucket 16, decode batch 1 and 4."""
    manifest = PackageManifest(
        schema_version=1,
        name=name,
        model_role="llm",
        kernel="synthetic",
        architecture=Architecture("qwen3_moe", 2, 32, 4, 2, 8, 4, 2, 16, VOCAB, 1e6, 1e-6),
        quantization="bf16",
        topology=Topology(2, (1, 2), "tp"),
        kv=KVDecl("bf16", "lane-major", LANES, LANE_CONTEXT, KV_BYTES_PER_TOKEN, "kv_heads"),
        submodels=(
            _submodel(PREFILL, "prefill", 1, BUCKET),
            _submodel(DECODE1, "decode", 1, 1),
            _submodel(DECODE4, "decode", 4, 1),
        ),
        memory=MemoryDecl(
            tuple(ChipMemoryDecl(c, 1 << c, PARAM_DRAM, PARAM_SRAM, WORKSPACE) for c in range(2)),
            2 * PARAM_DRAM,
        ),
        compatibility=Compatibility(">=0.7.6,<0.8", ">=0.7,<1"),
        files=(),
        tokenizer=TokenizerDecl("tokenizer", "", LANE_CONTEXT, (1,)),
        golden=GoldenDecl((3, 4), (), (), 0.0),
        timing=TIMING,
    )
    return replace(manifest, **overrides)


def single_chip_manifest(name: str = "solo", chip: int = 0, **overrides: Any) -> PackageManifest:
    """`make_manifest`'s model compiled for one chip (mask `1 << chip`): the whole KV on that chip."""
    memory = MemoryDecl((ChipMemoryDecl(chip, 1 << chip, PARAM_DRAM, PARAM_SRAM, WORKSPACE),), PARAM_DRAM)
    return make_manifest(name, topology=Topology(1, (1 << chip,), "none"), memory=memory, **overrides)


def need_dram_per_chip(manifest: PackageManifest) -> int:
    kv = manifest.kv
    return PARAM_DRAM + WORKSPACE + kv.bytes_per_token * kv.lanes * kv.lane_context // 2


# ---------------------------------------------------------------- fake kernel


_OFFSET = 1 << 20


def reference_logits(tokens: Sequence[int], positions: Sequence[int], vocab: int = VOCAB) -> np.ndarray:
    """The fake kernel's logits for a lane holding exactly these KV tokens/positions."""
    # offset so that empty (-1) and corrupted (negative) slots are valid seed words too
    seq = np.random.SeedSequence([len(tokens), *(int(v) + _OFFSET for v in (*tokens, *positions))])
    return np.random.default_rng(seq).standard_normal(vocab).astype(np.float32)


def expected_row(tokens: Sequence[int], positions: Sequence[int]) -> np.ndarray:
    """What calsim writes into a logits output row: the reference logits as bf16."""
    return reference_logits(tokens, positions).astype(ml_dtypes.bfloat16)


class Gate:
    """Blocks the fake kernel's next compute call until `open()`; `entered` is set when blocked."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self._release = threading.Event()

    def open(self) -> None:
        self._release.set()

    def block(self) -> None:
        self.entered.set()
        if not self._release.wait(timeout=10):
            raise RuntimeError("test gate never opened")


class FakeKernel(Kernel):
    """KV = the token and position stored per lane slot (-1 = empty); logits = reference_logits
    of the lane's slots 0..p+n-1 as stored now."""

    def __init__(self, manifest: PackageManifest, package_dir: Path, lanes: int, lane_context: int) -> None:
        self.vocab_size = manifest.architecture.vocab_size
        self.lanes = lanes
        self.lane_context = lane_context
        self.package_dir = package_dir
        self.tokens = np.full((lanes, lane_context), -1, dtype=np.int64)
        self.positions = np.full((lanes, lane_context), -1, dtype=np.int64)
        self.calls: list[tuple[str, Any]] = []
        self.gate: Gate | None = None
        self.fail_next: Exception | None = None  # raised by the next prefill/decode call

    def _hold(self) -> None:
        gate, self.gate = self.gate, None
        if gate is not None:
            gate.block()
        failure, self.fail_next = self.fail_next, None
        if failure is not None:
            raise failure

    def _check(self, lane: int, past: int, n: int) -> None:
        if not 0 <= lane < self.lanes:
            raise ValueError(f"lane {lane} out of range")
        if n < 1 or past < 0 or past + n > self.lane_context:
            raise ValueError("bad lengths")

    def history(self, lane: int, end: int) -> tuple[list[int], list[int]]:
        return self.tokens[lane, :end].tolist(), self.positions[lane, :end].tolist()

    def _logits(self, lane: int, end: int) -> np.ndarray:
        toks, pos = self.history(lane, end)
        return reference_logits(toks, pos, self.vocab_size)

    def prefill(self, lane: int, past_kv_len: int, tokens: np.ndarray, positions: np.ndarray) -> np.ndarray:
        self._hold()
        n = len(tokens)
        self._check(lane, past_kv_len, n)
        self.calls.append(("prefill", (lane, past_kv_len, tokens.tolist(), positions.tolist())))
        self.tokens[lane, past_kv_len : past_kv_len + n] = tokens
        self.positions[lane, past_kv_len : past_kv_len + n] = positions
        return self._logits(lane, past_kv_len + n)

    def decode(self, rows: Sequence[DecodeRow]) -> np.ndarray:
        self._hold()
        lanes = [r.lane for r in rows]
        if len(set(lanes)) != len(lanes):
            raise ValueError("repeated lane")
        for r in rows:
            self._check(r.lane, r.past_kv_len, 1)
        self.calls.append(("decode", tuple(rows)))
        out = []
        for r in rows:
            self.tokens[r.lane, r.past_kv_len] = r.token
            self.positions[r.lane, r.past_kv_len] = r.position
            out.append(self._logits(r.lane, r.past_kv_len + 1))
        return np.stack(out)

    def clear_lane(self, lane: int) -> None:
        self.calls.append(("clear", lane))
        self.tokens[lane] = -1
        self.positions[lane] = -1

    def corrupt_lane(self, lane: int, rng: np.random.Generator) -> None:
        self.calls.append(("corrupt", lane))
        self.tokens[lane] = -rng.integers(3, 1000, self.lane_context)
        self.positions[lane] = -rng.integers(3, 1000, self.lane_context)

    @property
    def kv_bytes(self) -> int:
        return int(self.tokens.nbytes + self.positions.nbytes)

    def lanes_touched(self, kind: str) -> list[int]:
        return [arg for op, arg in self.calls if op == kind]


@dataclass
class KernelBox:
    """A `kernel_factory` option that remembers every fake kernel it built."""

    built: list[FakeKernel] = field(default_factory=list)
    fail_with: Exception | None = None

    def __call__(self, manifest: PackageManifest, package_dir: Path, lanes: int, lane_context: int) -> Kernel:
        if self.fail_with is not None:
            raise self.fail_with
        kernel = FakeKernel(manifest, package_dir, lanes, lane_context)
        self.built.append(kernel)
        return kernel


def kernel_of(model: CalsimModel) -> FakeKernel:
    assert isinstance(model.kernel, FakeKernel)
    return model.kernel


# ---------------------------------------------------------------- job buffers


@dataclass
class Bufs:
    """Registered tokens/positions/logits buffers for one submodel shape."""

    submodel: str
    tokens: HostBuffer
    positions: HostBuffer
    logits: HostBuffer

    def spec(self, rows: Sequence[RowSpec], submodel: str | None = None) -> JobSpec:
        return JobSpec(
            submodel=submodel or self.submodel,
            inputs={"tokens": self.tokens.buffer_id, "positions": self.positions.buffer_id},
            outputs={"logits": self.logits.buffer_id},
            rows=tuple(rows),
        )

    def out(self, row: int) -> np.ndarray:
        return np.array(self.logits.array[row], copy=True)


def make_bufs(device: CalsimDevice, model: CalsimModel, submodel: str) -> Bufs:
    info = model.submodel(submodel)
    shape = (info.batch, info.max_tokens)
    return Bufs(
        submodel,
        device.register_buffer(np.zeros(shape, dtype=np.int32)),
        device.register_buffer(np.zeros(shape, dtype=np.int32)),
        device.register_buffer(np.zeros((info.batch, model.vocab_size), dtype=ml_dtypes.bfloat16)),
    )


def prefill_spec(bufs: Bufs, lane: int, tokens: Sequence[int], past: int = 0) -> JobSpec:
    """Fill row 0 of a prefill buffer set with `tokens` at positions past.. and build the job."""
    bufs.tokens.array[0, : len(tokens)] = tokens
    bufs.positions.array[0, : len(tokens)] = np.arange(past, past + len(tokens))
    return bufs.spec([RowSpec(lane, past, len(tokens))])


def decode_spec(bufs: Bufs, rows: Sequence[tuple[int, int, int]]) -> JobSpec:
    """rows: (lane, past_kv_len, token); the position fed is past_kv_len."""
    for i, (_lane, past, token) in enumerate(rows):
        bufs.tokens.array[i, 0] = token
        bufs.positions.array[i, 0] = past
    return bufs.spec([RowSpec(lane, past, 1) for lane, past, _ in rows])


def bitwise_equal(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def is_poison(a: np.ndarray) -> bool:
    """Every byte of `a` is calsim's output poison (an output row before `wait` returned DONE:
    a NaN as bf16, distinct from the NaN of a `nan_logits` fault)."""
    raw = np.ascontiguousarray(a).view(np.uint8)
    return raw.size > 0 and bool((raw == POISON_BYTE).all())
