"""Small stand-ins for the vendor's per-submodel files (docs/sources.md 003 §3).

A real calbin submodel folder holds `submodel_memory_reserved_info.txt` (type, batch, chip
mode, I/O, CSR, file chip mask) and per-chip ping/pong command binaries. calsim does not
execute them, but a package keeps the vendor's shape so the validator, the file-list checks
and operators see a familiar layout. Each stand-in is a few bytes, deterministic, and says what
it stands in for. Data flow: `SubmodelDecl` + `Topology` -> text/bytes -> `PackageWriter`.
"""

from __future__ import annotations

import hashlib

from calculet.daemon.package.manifest import SubmodelDecl, TensorDecl, Topology
from calculet.ops.sim_packages.writer import PackageWriter

INFO_NAME = "submodel_memory_reserved_info.txt"
BANKS = ("ping", "pong")
COMMAND_MAGIC = b"CALSIM-STANDIN\x00\x00"


def _tensor_line(kind: str, index: int, t: TensorDecl) -> str:
    shape = ",".join(str(d) for d in t.shape)
    return f"{kind}[{index}]: name={t.name} shape=[{shape}] dtype={t.dtype} layout={t.layout}"


def submodel_info_text(sub: SubmodelDecl, topology: Topology) -> str:
    """The stand-in `submodel_memory_reserved_info.txt`: a summary of the submodel, one fact a line."""
    mask = 0
    for m in topology.chip_masks:
        mask |= m
    lines = [
        "# calsim stand-in for the vendor's submodel_memory_reserved_info.txt (docs/sources.md 003 §3);",
        "# the authoritative description is calculet-package.json.",
        f"smodel_name: {sub.name}",
        f"smodel_type: {sub.smodel_type}",
        f"batch: {sub.batch}",
        f"max_tokens: {sub.max_tokens}",
        f"context: {sub.context}",
        f"chip_mode: {'MCHIP' if topology.chips > 1 else 'SCHIP'}",
        f"chips: {topology.chips}",
        f"file_chip_mask: {hex(mask)}",
        *(_tensor_line("input", i, t) for i, t in enumerate(sub.inputs)),
        *(_tensor_line("output", i, t) for i, t in enumerate(sub.outputs)),
        *(f"csr {name}: {offset}" for name, offset in sub.csr.items()),
    ]
    return "\n".join(lines) + "\n"


def command_standin(sub: SubmodelDecl, chip: int, bank: str) -> bytes:
    """An 80-byte stand-in for `cpu_chip{chip}_{bank}.bin`: magic, its slot's name, a digest of it."""
    label = f"{sub.name}/cpu_chip{chip}_{bank}".encode()
    return COMMAND_MAGIC + label.ljust(32, b"\x00")[:32] + hashlib.sha256(label).digest()


def write_submodel_folder(writer: PackageWriter, sub: SubmodelDecl, topology: Topology) -> None:
    """Write `sub.folder/` with its info text and the ping/pong command stand-ins of every chip it
    runs on (the chips its masks name)."""
    writer.write_text(f"{sub.folder}/{INFO_NAME}", submodel_info_text(sub, topology), "metadata")
    for chip in sorted(mask.bit_length() - 1 for mask in topology.chip_masks):
        for bank in BANKS:
            writer.write_bytes(f"{sub.folder}/cpu_chip{chip}_{bank}.bin", command_standin(sub, chip, bank), "command")
