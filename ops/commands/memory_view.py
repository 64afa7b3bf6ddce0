"""`calctl status`'s per-model memory table: each resident model's DRAM and SRAM per chip, the
capacity planner's figure (`calctl capacity`'s arithmetic, for the KV layout the model was configured
with) beside the device's measured one (what its configure took), and their difference; and the
board's cross-chip (D2D) traffic line. Pure functions from protobuf messages to rich renderables."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.table import Table

from calculet.v1 import observe_pb2

GIB = 1 << 30
MIB = 1 << 20


def model_memory_table(models: Sequence[observe_pb2.ModelStatus]) -> Table:
    """One row per resident model and chip; a model the device has not measured shows `-`."""
    table = Table(title="model memory per chip (planned = calctl capacity, measured = taken at configure)",
                  title_justify="left")  # fmt: skip
    for name in ("alias", "gen", "chip", "DRAM planned GiB", "DRAM measured GiB", "DRAM diff MiB",
                 "SRAM planned MiB", "SRAM measured MiB"):  # fmt: skip
        table.add_column(name, justify="left" if name == "alias" else "right")
    for m in models:
        for c in m.memory:
            measured = c.measured
            table.add_row(
                m.alias, str(m.generation), str(c.chip), f"{c.planned_dram_bytes / GIB:.3f}",
                f"{c.dram_bytes / GIB:.3f}" if measured else "-",
                f"{(c.dram_bytes - c.planned_dram_bytes) / MIB:+.1f}" if measured else "-",
                f"{c.planned_sram_bytes / MIB:.2f}", f"{c.sram_bytes / MIB:.2f}" if measured else "-",
            )  # fmt: skip
    return table


def memory_json(models: Sequence[observe_pb2.ModelStatus]) -> list[dict[str, Any]]:
    """The same as JSON: per model and chip, planned and measured bytes (measured null when unknown)."""
    return [
        {
            "alias": m.alias,
            "generation": m.generation,
            "chips": [
                {
                    "chip": c.chip,
                    "planned_dram_bytes": c.planned_dram_bytes,
                    "planned_sram_bytes": c.planned_sram_bytes,
                    "dram_bytes": c.dram_bytes if c.measured else None,
                    "sram_bytes": c.sram_bytes if c.measured else None,
                }
                for c in m.memory
            ],
        }
        for m in models
    ]


def d2d_text(u: Any) -> str:
    """`, D2D ...` for a utilisation whose jobs moved bytes between chips, else "" (a package that
    declares no cross-chip traffic, or a daemon that does not count it)."""
    nbytes = getattr(u, "d2d_bytes", 0)
    if not nbytes:
        return ""
    share = u.d2d_seconds / u.compute_seconds if u.compute_seconds else 0.0
    return f", D2D {nbytes / MIB:,.1f} MiB in {u.d2d_seconds:.3f} s ({share:.1%} of compute)"
