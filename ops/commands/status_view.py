"""Readable rendering of a daemon's Status and Health answers for `calctl status` / `calctl health`.

Pure functions from protobuf messages to rich renderables or text lines; no I/O, no gRPC. Sections
of `render_status`: board and overall state, device and memory per chip, models (state,
generation, package, queues, lane summary), each model's memory per chip (planned beside measured,
`memory_view.py`), one lane table per model (state, job, KV length),
unfinished jobs, counters (device, jobs, buffer pool) and the device utilisation (busy ratio and
tokens/s from StatusResponse.utilization; read defensively: a daemon without it says so), resets and
the reset budget.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC
from typing import Any

from google.protobuf.internal.enum_type_wrapper import EnumTypeWrapper
from google.protobuf.timestamp_pb2 import Timestamp
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from calculet.ops.commands.memory_view import d2d_text, model_memory_table
from calculet.v1 import common_pb2, observe_pb2

GIB = 1 << 30
MIB = 1 << 20


def enum_name(enum: EnumTypeWrapper, value: int, prefix: str) -> str:
    """`MODEL_STATE_READY` -> "READY"; a value this build does not know -> "?<n>"."""
    try:
        return enum.Name(value).removeprefix(prefix)
    except ValueError:
        return f"?{value}"


def serving(value: int) -> str:
    return enum_name(common_pb2.ServingStatus, value, "SERVING_STATUS_")


def model_state(value: int) -> str:
    return enum_name(common_pb2.ModelState, value, "MODEL_STATE_")


def timestamp(ts: Timestamp) -> str:
    return ts.ToDatetime(tzinfo=UTC).isoformat(timespec="seconds")


def render_status(s: observe_pb2.StatusResponse) -> Group:
    lanes: list[RenderableType] = [_lanes(m) for m in s.models]
    return Group(
        _board(s), _chips(s.device), _models(s.models), model_memory_table(s.models), *lanes, _jobs(s.jobs),
        _counters(s), _resets(s.resets),
    )  # fmt: skip


def _board(s: observe_pb2.StatusResponse) -> Text:
    b, d, caps = s.board, s.device, s.device.capabilities
    policy = enum_name(observe_pb2.Policy, s.policy, "POLICY_")
    lines = [
        f"board {b.name} (index {b.index}), daemon {b.daemon_version}, driver {b.driver}"
        + (", fault injection ON" if b.fault_injection else "")
        + (f", started {timestamp(b.started_at)}" if b.HasField("started_at") else ""),
        f"health {serving(s.health)}" + (", DRAINING (admission stopped)" if s.draining else "")
        + f", policy {policy}, in flight {s.inflight_submissions}/{s.max_inflight}",
        f"device {d.name} board {d.board_index}: runtime {d.runtime_version}, driver {d.driver_version}, "
        f"firmware {d.firmware_version}",
        f"capabilities: max in flight {caps.max_inflight}, ping/pong {_yes(caps.ping_pong)}, "
        f"resident configurations {caps.max_resident_configurations}, lane selection {_yes(caps.lane_selection)}"
        + ("" if caps.lane_selection else f" (fixed slots, idle rows {caps.inactive_rows or '?'})"),
    ]  # fmt: skip
    for m in s.models:
        if m.HasField("slots") and m.slots.compiled_rows:
            fill = m.slots.active_rows / m.slots.compiled_rows
            lines.append(
                f"decode rows of {m.alias}: batch fill {fill:.1%} ({m.slots.active_rows:,} of "
                f"{m.slots.compiled_rows:,}), {m.slots.compactions:,} compactions"
            )
    lines += [f"WARNING: {w}" for w in s.warnings]
    return Text("\n".join(lines))


def _chips(d: observe_pb2.DeviceInfo) -> Table:
    table = Table(title="device memory per chip", title_justify="left")
    for name in ("chip", "DRAM used GiB", "DRAM total GiB", "DRAM %", "SRAM used MiB", "SRAM total MiB"):
        table.add_column(name, justify="right")
    for c in d.chips:
        pct = 100.0 * c.dram_used_bytes / c.dram_total_bytes if c.dram_total_bytes else 0.0
        table.add_row(
            str(c.index), f"{c.dram_used_bytes / GIB:.2f}", f"{c.dram_total_bytes / GIB:.2f}", f"{pct:.0f}%",
            f"{c.sram_used_bytes / MIB:.1f}", f"{c.sram_total_bytes / MIB:.1f}",
        )  # fmt: skip
    return table


def _models(models: Sequence[observe_pb2.ModelStatus]) -> Table:
    table = Table(title="models", title_justify="left")
    columns = ("alias", "state", "gen", "package", "lanes free/parked/active/reserved/unknown", "queues d/s/l",
               "prefix hit/miss tokens", "ready at")  # fmt: skip
    for name in columns:
        table.add_column(name)
    for m in models:
        counts = [sum(1 for lane in m.lanes if lane.state == st) for st in _LANE_ORDER]
        q, p = m.queues, m.prefix_cache
        prefix = f"{p.hit_tokens}/{p.miss_tokens}" if p.enabled else "off"
        table.add_row(
            m.alias, model_state(m.state), str(m.generation), f"{m.package_name} ({m.package_path})",
            "/".join(map(str, counts)), f"{q.decode_ready}/{q.short_prefill}/{q.long_prefill}",
            prefix if m.HasField("prefix_cache") else "-", timestamp(m.ready_at) if m.HasField("ready_at") else "-",
        )  # fmt: skip
        if m.HasField("error"):
            table.add_row("", Text(f"error: {m.error.message}"), *[""] * (len(columns) - 2))
        if m.HasField("prefill_offset") and m.prefill_offset.verdict != observe_pb2.PREFILL_OFFSET_VERDICT_PROVEN:
            table.add_row("", Text(_offset_line(m.prefill_offset)), *[""] * (len(columns) - 2))
    return table


def _offset_line(o: observe_pb2.PrefillOffsetStatus) -> str:
    """`prefill at an offset undeclared: chunked prefill and prefix reuse off (why)` (docs/daemon.md,
    "Prefill at an offset"); shown only where it is not proven."""
    verdict = observe_pb2.PrefillOffsetVerdict.Name(o.verdict).removeprefix("PREFILL_OFFSET_VERDICT_").lower()
    return f"prefill at an offset {verdict}: chunked prefill and prefix reuse off ({o.reason})"


_LANE_ORDER = (
    observe_pb2.LANE_STATE_FREE,
    observe_pb2.LANE_STATE_PARKED,
    observe_pb2.LANE_STATE_ACTIVE,
    observe_pb2.LANE_STATE_RESERVED,
    observe_pb2.LANE_STATE_UNKNOWN,
)


def _lanes(m: observe_pb2.ModelStatus) -> Table:
    table = Table(title=f"lanes of {m.alias} (generation {m.generation})", title_justify="left")
    for name in ("lane", "state", "job", "kv tokens"):
        table.add_column(name, justify="right" if name in ("lane", "kv tokens") else "left")
    for lane in m.lanes:
        state = enum_name(observe_pb2.LaneState, lane.state, "LANE_STATE_")
        table.add_row(str(lane.index), state, lane.job_id or "-", str(lane.kv_length))
    return table


def _jobs(jobs: Sequence[observe_pb2.JobSummary]) -> Table:
    table = Table(title=f"unfinished jobs ({len(jobs)})", title_justify="left")
    for name in ("job", "model", "gen", "state", "lane", "prompt", "completion", "prio", "age s", "client id"):
        table.add_column(name)
    for j in jobs:
        table.add_row(
            j.job_id, j.model, str(j.generation), enum_name(observe_pb2.JobState, j.state, "JOB_STATE_"),
            str(j.lane) if j.HasField("lane") else "-", str(j.prompt_tokens), str(j.completion_tokens),
            str(j.priority), f"{j.age_s:.1f}", j.client_request_id or "-",
        )  # fmt: skip
    return table


def _counters(s: observe_pb2.StatusResponse) -> Text:
    d, j, p = s.device_counters, s.job_counters, s.buffer_pool
    return Text(
        "\n".join([
            f"device jobs: submitted {d.submitted}, pending {d.pending}, running {d.running}, "
            f"finished {d.finished}, left {d.left}",
            f"jobs: accepted {j.accepted}, rejected {j.rejected}, completed {j.completed}, cancelled {j.cancelled}, "
            f"failed {j.failed}, recoveries {j.recoveries}",
            f"buffer pool: in use {p.in_use}, free {p.free}, quarantined {p.quarantined}, waits {p.waits}",
            utilization_line(s),
        ])
    )  # fmt: skip


_UTILIZATION = "utilization"  # StatusResponse field 14 (DeviceUtilization); absent from older builds


def device_utilization(s: observe_pb2.StatusResponse) -> Any | None:
    """The StatusResponse's DeviceUtilization, or None when the daemon (or this build) has none."""
    if _UTILIZATION not in s.DESCRIPTOR.fields_by_name or not s.HasField(_UTILIZATION):
        return None
    return getattr(s, _UTILIZATION)


def utilization_line(s: observe_pb2.StatusResponse) -> str:
    u = device_utilization(s)
    if u is None:
        return "utilisation: not reported by this daemon"
    return (
        f"utilisation: device busy {u.recent_busy_ratio:.0%} over the last {u.recent_window_seconds:.0f} s "
        f"({u.busy_ratio:.0%} since start), {u.tokens_per_second:.1f} tokens/s, "
        f"{u.generated_tokens} tokens generated{d2d_text(u)}"
    )


def _resets(r: observe_pb2.ResetSummary) -> Text:
    line = f"resets: {r.count}"
    if r.count:
        kind = enum_name(common_pb2.ResetKind, r.last_kind, "RESET_KIND_")
        when = f" at {timestamp(r.last_at)}" if r.HasField("last_at") else ""
        line += f", last {kind}{when} ({'ok' if r.last_ok else 'FAILED'}): {r.last_reason}"
    return Text(f"{line}\n{budget_line(r.budget)}")


def budget_line(b: observe_pb2.ResetBudget) -> str:
    text = f"reset budget: {b.used}/{b.limit} automatic resets per {b.window_s:g} s"
    return text + (" — EXHAUSTED, waiting for an operator" if b.exhausted else "")


def health_lines(h: observe_pb2.HealthResponse) -> list[str]:
    """One line for the board, one per model."""
    head = f"board {serving(h.status)}, device {'healthy' if h.device_healthy else 'UNHEALTHY'}"
    head += f"; {budget_line(h.reset_budget)}" + (f"; {h.reason}" if h.reason else "")
    lines = [head]
    for m in h.models:
        lines.append(f"  {m.alias}: {serving(m.status)}, state {model_state(m.state)}, generation {m.generation}")
    return lines


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"
