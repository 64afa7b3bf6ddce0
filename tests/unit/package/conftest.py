"""A factory for small VALID package directories; tests break them one defect at a time.

The manifest is built from the schema dataclasses (never hand-written JSON), the files are small
deterministic blobs whose sizes and SHA-256 the manifest records, and the memory figures close
exactly: params DRAM + SRAM = each `param_blk{chip}.bin`, and `device_memory_required_bytes` is
the sum over chips of params DRAM + workspace + KV share (the validator's rule).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from calculet.daemon.package.manifest import (
    MANIFEST_NAME,
    Architecture,
    ChipMemoryDecl,
    Compatibility,
    DecodePoint,
    FileEntry,
    GoldenDecl,
    KVDecl,
    MemoryDecl,
    PackageManifest,
    SubmodelDecl,
    TensorDecl,
    TimingDecl,
    TokenizerDecl,
    Topology,
    write_manifest,
)

VOCAB = 512
CONTEXT = 256
LANES = 4
# params DRAM / SRAM per chip; param_blk{chip}.bin holds both, so its size is the sum.
PARAMS = ((3072, 1024), (1536, 512))
WORKSPACE = 65_536
ARCH = Architecture(
    family="qwen3_moe",
    layers=2,
    hidden_size=64,
    q_heads=4,
    kv_heads=2,
    head_dim=16,
    experts=4,
    experts_per_token=2,
    expert_intermediate=64,
    vocab_size=VOCAB,
    rope_theta=10_000.0,
    rms_norm_eps=1e-6,
)
KV_BYTES_PER_TOKEN = 2 * 2 * 2 * 16 * 2  # layers x kv_heads x (K+V) x head_dim x bf16


def blob(name: str, size: int) -> bytes:
    """Deterministic content of `size` bytes, different per name."""
    seed = hashlib.sha256(name.encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


FILES: dict[str, tuple[str, bytes]] = {
    "param_blk0.bin": ("params", blob("p0", sum(PARAMS[0]))),
    "param_blk1.bin": ("params", blob("p1", sum(PARAMS[1]))),
    "prefill/ccu0_chip0.elf": ("elf", blob("pe", 300)),
    "decode/ccu0_chip0.elf": ("elf", blob("de", 200)),
    "tokenizer/tokenizer.json": ("tokenizer", b'{"version": "1.0", "model": {"type": "BPE"}}\n'),
    "hparam.yaml": ("metadata", b"prefill: {cur: 255, total: 255}\ndecode: {cur: 1, total: 256}\n"),
}


def submodel(name: str, role: str, batch: int, max_tokens: int, context: int = CONTEXT) -> SubmodelDecl:
    """A submodel whose tensors match its role: tokens/positions [batch, max_tokens], logits [batch, vocab]."""
    return SubmodelDecl(
        name=name,
        role=role,
        smodel_type=f"llm_{role}",
        batch=batch,
        max_tokens=max_tokens,
        context=context,
        folder=role,
        inputs=(
            TensorDecl("tokens", (batch, max_tokens), "int32"),
            TensorDecl("positions", (batch, max_tokens), "int32"),
        ),
        outputs=(TensorDecl("logits", (batch, VOCAB), "bf16"),),
        csr={"cur_seq_len": "0x1104", "past_kv_cur_seq_len": "0x1144"},
    )


def required_bytes(m: PackageManifest) -> int:
    """The board-wide DRAM figure that adds up for `m` (params DRAM + workspace + KV share, summed)."""
    per_chip = -(-m.kv.bytes_per_token // m.topology.chips)
    return sum(
        c.param_dram_bytes + c.workspace_bytes + per_chip * m.kv.lanes * m.kv.lane_context for c in m.memory.chips
    )


def with_required(m: PackageManifest) -> PackageManifest:
    """`m` with `device_memory_required_bytes` recomputed after a change to KV or memory."""
    return dataclasses.replace(m, memory=dataclasses.replace(m.memory, device_memory_required_bytes=required_bytes(m)))


def valid_manifest() -> PackageManifest:
    chips = tuple(
        ChipMemoryDecl(chip=i, chip_mask=1 << i, param_dram_bytes=d, param_sram_bytes=s, workspace_bytes=WORKSPACE)
        for i, (d, s) in enumerate(PARAMS)
    )
    m = PackageManifest(
        schema_version=1,
        name="testpkg",
        model_role="llm",
        kernel="numeric",
        architecture=ARCH,
        quantization="bf16",
        topology=Topology(chips=2, chip_masks=(1, 2), parallelism="tp"),
        kv=KVDecl(
            dtype="bf16",
            layout="lane-major",
            lanes=LANES,
            lane_context=CONTEXT,
            bytes_per_token=KV_BYTES_PER_TOKEN,
            split="kv_heads",
        ),
        submodels=(submodel("prefill_128", "prefill", 1, 128), submodel("decode_b4", "decode", LANES, 1)),
        memory=MemoryDecl(chips=chips, device_memory_required_bytes=0),
        compatibility=Compatibility(runtime=">=0.7.6,<0.8", driver="*", compiler={"calcc": "575c2d7"}),
        files=tuple(
            FileEntry(path, len(data), hashlib.sha256(data).hexdigest(), role) for path, (role, data) in FILES.items()
        ),
        tokenizer=TokenizerDecl(
            path="tokenizer/tokenizer.json",
            chat_template="{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}",
            model_max_length=CONTEXT,
            eos_token_ids=(2,),
            bos_token_id=1,
            pad_token_id=0,
        ),
        golden=GoldenDecl(
            prompt_tokens=(5, 6, 7), prefill_top=((9, 3.5), (4, 2.0)), decode_tokens=(9, 10, 11), logit_atol=0.05
        ),
        timing=TimingDecl(
            decode_curve=(DecodePoint(0, 1.0), DecodePoint(CONTEXT, 2.0)),
            prefill_fixed_ms=1.0,
            prefill_ms_per_token=0.1,
            batch_alpha=0.1,
            h2d_gbps=10.0,
            d2h_gbps=10.0,
            sources={"all": "test"},
        ),
    )
    return with_required(m)


class PackageFactory:
    """Writes packages under one tmp directory.

    Args:
        base: a fresh temporary directory (pytest's tmp_path).
    """

    def __init__(self, base: Path) -> None:
        self.base = base
        self.count = 0

    def write(self, manifest: PackageManifest | None = None) -> Path:
        """Write the valid files and `manifest` (default: the valid one) into a new package directory."""
        self.count += 1
        root = self.base / f"pkg{self.count}"
        for rel, (_, data) in FILES.items():
            path = root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        write_manifest(root, manifest or valid_manifest())
        return root

    @staticmethod
    def edit(root: Path, mutate: Callable[[dict[str, Any]], Any]) -> None:
        """Apply `mutate` to the manifest's raw JSON in place (for structural defects)."""
        path = root / MANIFEST_NAME
        raw = json.loads(path.read_text())
        mutate(raw)
        path.write_text(json.dumps(raw, indent=2))


@pytest.fixture
def factory(tmp_path: Path) -> PackageFactory:
    return PackageFactory(tmp_path)
