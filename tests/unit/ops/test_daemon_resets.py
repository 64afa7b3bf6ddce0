"""`calctl resets`: the audit table names every kind of record, escalations included."""

from __future__ import annotations

from rich.console import Console

from calculet.ops.commands.daemon_resets import reset_table
from calculet.v1 import common_pb2, observe_pb2


def test_the_table_names_a_drain_escalation_and_each_reset_kind() -> None:
    summary = observe_pb2.ResetSummary(count=3)
    for kind, fault in (
        (common_pb2.RESET_KIND_CCU, "hang"),
        (common_pb2.RESET_KIND_CONFIGURATION, "operator"),
        (common_pb2.RESET_KIND_DRAIN, "submit error streak"),
    ):
        summary.history.add(kind=kind, automatic=True, fault=fault, ok=True)
    console = Console(width=300, record=True)
    console.print(reset_table(summary))
    rows = [line for line in console.export_text().splitlines() if "automatic" in line]
    assert [row.split("│")[2].strip() for row in rows] == ["ccu", "configuration", "drain"], rows


def test_the_table_names_an_unload_and_a_reset_that_did_not_bring_the_memory_back() -> None:
    summary = observe_pb2.ResetSummary(count=1)
    summary.history.add(kind=common_pb2.RESET_KIND_UNLOAD, automatic=True, fault="unload_leak", ok=False)
    message = "compute units reset: device memory is not back"
    summary.history.add(kind=common_pb2.RESET_KIND_CCU, fault="operator", ok=False, message=message)
    console = Console(width=300, record=True)
    console.print(reset_table(summary))
    rows = [line for line in console.export_text().splitlines() if "automatic" in line or "operator" in line]
    assert [row.split("│")[2].strip() for row in rows] == ["unload", "ccu"], rows
    assert "FAILED: compute units reset: device memory is not back" in rows[1]


def test_every_kind_the_protocol_defines_is_named() -> None:
    summary = observe_pb2.ResetSummary(count=len(common_pb2.ResetKind.values()))
    kinds = [k for k in common_pb2.ResetKind.values() if k != common_pb2.RESET_KIND_UNSPECIFIED]
    for kind in kinds:
        summary.history.add(kind=kind, automatic=True, fault="f", ok=True)
    console = Console(width=300, record=True)
    console.print(reset_table(summary))
    rows = [line for line in console.export_text().splitlines() if "automatic" in line]
    names = [row.split("│")[2].strip() for row in rows]
    assert names == [common_pb2.ResetKind.Name(k).removeprefix("RESET_KIND_").lower() for k in kinds]
    assert {"device", "switch", "unload"} <= set(names) and "?" not in names
