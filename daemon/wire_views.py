"""Protobuf forms of the observation and operations planes (the server side of `wire`).

Kept beside `wire.py` (requests, events, errors) so every protobuf conversion lives in these two
modules; domain code never imports `*_pb2`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from google.protobuf.timestamp_pb2 import Timestamp

from calculet.common.errors import InvalidArgument
from calculet.common.prefix import BLOCK_TOKENS
from calculet.daemon.calsim.faults import Fault, FaultKind
from calculet.daemon.core.audit import AuditEntry
from calculet.daemon.core.kv import LaneSnapshot, LaneState
from calculet.daemon.core.models import LoadProgress
from calculet.daemon.core.observe.status import (
    HealthView,
    JobView,
    LoadView,
    ModelInfoView,
    ModelLoadView,
    ModelView,
    PrefixCacheView,
    SlotView,
    StatusView,
    UtilizationView,
)
from calculet.daemon.core.prefill_offset import OffsetDecision, OffsetVerdict
from calculet.daemon.core.resets.budget import BudgetView, ResetReport
from calculet.daemon.device.types import DeviceInfo, EngineSlot, MemoryUsage
from calculet.daemon.wire import error_status, kind_to_pb, model_state_to_pb
from calculet.v1 import common_pb2, observe_pb2, operate_pb2

# GetModel's pieces of tokenizer.json (with the chat template in the first message): every message
# stays far below gRPC's default 4 MiB receive limit, so stock clients take them all.
TOKENIZER_PIECE_BYTES = 1 << 20

_LANE = {
    LaneState.FREE: observe_pb2.LANE_STATE_FREE,
    LaneState.RESERVED: observe_pb2.LANE_STATE_RESERVED,
    LaneState.ACTIVE: observe_pb2.LANE_STATE_ACTIVE,
    LaneState.UNKNOWN: observe_pb2.LANE_STATE_UNKNOWN,
    LaneState.PARKED: observe_pb2.LANE_STATE_PARKED,
}
_JOB = {
    "WAITING": observe_pb2.JOB_STATE_QUEUED,
    "PREFILL": observe_pb2.JOB_STATE_PREFILL,
    "PARTIAL": observe_pb2.JOB_STATE_PREFILL,  # between two chunks of its prefill
    "READY": observe_pb2.JOB_STATE_DECODE,
    "DECODE": observe_pb2.JOB_STATE_DECODE,
    "RECOVER": observe_pb2.JOB_STATE_RECOVERING,
    "DONE": observe_pb2.JOB_STATE_FINISHED,
}
_BANK = {EngineSlot.AUTO: 0, EngineSlot.PING: 0, EngineSlot.PONG: 1}  # BankUtilization.bank
_RESET_KIND = {
    "ccu": common_pb2.RESET_KIND_CCU,
    "configuration": common_pb2.RESET_KIND_CONFIGURATION,
    # Audit records only: escalations that reset nothing.
    "drain": common_pb2.RESET_KIND_DRAIN,
    "quarantine": common_pb2.RESET_KIND_QUARANTINE,
    "restart": common_pb2.RESET_KIND_RESTART,
    "unload": common_pb2.RESET_KIND_UNLOAD,
    "switch": common_pb2.RESET_KIND_SWITCH,
    "resume": common_pb2.RESET_KIND_RESUME,
}
_FAULT = {
    operate_pb2.FAULT_KIND_SUBMIT_ERROR: FaultKind.SUBMIT_ERROR,
    operate_pb2.FAULT_KIND_CCU_EXCEPTION: FaultKind.CCU_EXCEPTION,
    operate_pb2.FAULT_KIND_HANG: FaultKind.HANG,
    operate_pb2.FAULT_KIND_NAN_LOGITS: FaultKind.NAN_LOGITS,
    operate_pb2.FAULT_KIND_SLOW_JOB: FaultKind.SLOW_JOB,
    operate_pb2.FAULT_KIND_DEVICE_LOST: FaultKind.DEVICE_LOST,
}


def _serving(serving: bool, draining: bool, device_healthy: bool = True) -> int:
    """SERVING, DRAINING (refusing new work, finishing old) or NOT_SERVING (common.proto).

    The core stops admitting when the device is lost, which also reads as "draining"; a board
    whose device is gone finishes nothing, so it is NOT_SERVING.
    """
    draining = draining and device_healthy
    if serving:
        return int(common_pb2.SERVING_STATUS_SERVING)
    return int(common_pb2.SERVING_STATUS_DRAINING if draining else common_pb2.SERVING_STATUS_NOT_SERVING)


def _timestamp(unix: float) -> Timestamp:
    ts = Timestamp()
    ts.FromNanoseconds(int(unix * 1e9))
    return ts


def _budget(b: BudgetView) -> observe_pb2.ResetBudget:
    return observe_pb2.ResetBudget(used=b.used, limit=b.limit, window_s=b.window_s, exhausted=b.exhausted)


def health_to_pb(h: HealthView) -> observe_pb2.HealthResponse:
    return observe_pb2.HealthResponse(
        status=_serving(h.serving, h.draining, h.device_healthy),  # type: ignore[arg-type]
        device_healthy=h.device_healthy,
        models=[
            observe_pb2.ModelHealth(
                alias=m.alias,
                status=_serving(h.serving and m.state.serving, h.draining, h.device_healthy),  # type: ignore[arg-type]
                state=model_state_to_pb(m.state),  # type: ignore[arg-type]
                generation=m.generation,
            )
            for m in h.models
        ],
        reset_budget=_budget(h.reset_budget),
        reason=h.reason,
    )


def _device_to_pb(info: DeviceInfo, memory: MemoryUsage) -> observe_pb2.DeviceInfo:
    used = {c.chip: c for c in memory.chips}
    return observe_pb2.DeviceInfo(
        name=info.name,
        board_index=info.board_index,
        chips=[
            observe_pb2.ChipInfo(
                index=c.index,
                dram_total_bytes=c.dram_bytes,
                dram_used_bytes=used[c.index].dram_used if c.index in used else 0,
                sram_total_bytes=c.sram_bytes,
                sram_used_bytes=used[c.index].sram_used if c.index in used else 0,
            )
            for c in info.chips
        ],
        runtime_version=info.runtime_version,
        driver_version=info.driver_version,
        firmware_version=info.firmware_version,
        capabilities=observe_pb2.DeviceCapabilities(
            max_inflight=info.capabilities.max_inflight,
            ping_pong=info.capabilities.ping_pong,
            max_resident_configurations=info.capabilities.max_resident_configurations,
            lane_selection=info.capabilities.lane_selection,
            inactive_rows="" if info.capabilities.lane_selection else info.capabilities.inactive_rows.value,
        ),
    )


def _lane_to_pb(lane: LaneSnapshot) -> observe_pb2.LaneStatus:
    parked_s = max(0.0, time.monotonic() - lane.parked_at) if lane.parked_at is not None else 0.0
    return observe_pb2.LaneStatus(
        index=lane.lane, state=_LANE[lane.state], job_id=lane.owner or "", kv_length=lane.length, parked_s=parked_s
    )


def _prefix_cache_to_pb(p: PrefixCacheView) -> observe_pb2.PrefixCacheStatus:
    return observe_pb2.PrefixCacheStatus(
        enabled=p.enabled, min_tokens=p.min_tokens, parked_lanes=p.parked_lanes, hit_tokens=p.hit_tokens,
        miss_tokens=p.miss_tokens, hits=p.hits, misses=p.misses, evictions=p.evictions, dropped=p.dropped,
    )  # fmt: skip


def _slots_to_pb(v: SlotView) -> observe_pb2.SlotStatus:
    return observe_pb2.SlotStatus(
        fixed=v.fixed, inactive_rows=v.inactive_rows, active_rows=v.active_rows, compiled_rows=v.compiled_rows,
        compactions=v.compactions, compacted_tokens=v.compacted_tokens,
    )  # fmt: skip


_OFFSET_VERDICT = {
    OffsetVerdict.PROVEN: observe_pb2.PREFILL_OFFSET_VERDICT_PROVEN,
    OffsetVerdict.REFUTED: observe_pb2.PREFILL_OFFSET_VERDICT_REFUTED,
    OffsetVerdict.UNDECLARED: observe_pb2.PREFILL_OFFSET_VERDICT_UNDECLARED,
}


def _prefill_offset_to_pb(d: OffsetDecision) -> observe_pb2.PrefillOffsetStatus:
    return observe_pb2.PrefillOffsetStatus(
        verdict=_OFFSET_VERDICT[d.verdict], reason=d.reason, chunked_prefill=d.chunked,
        prefix_reuse=d.prefix_reuse, jump_forward=d.jump,
    )  # fmt: skip


def _prefix_blocks_to_pb(m: ModelLoadView) -> observe_pb2.PrefixBlocks | None:
    if m.prefix_hashes is None:
        return None
    return observe_pb2.PrefixBlocks(
        block_tokens=BLOCK_TOKENS, hashes=m.prefix_hashes, truncated=m.prefix_truncated, lane_tips=m.prefix_tips
    )


def _reset_record_to_pb(e: AuditEntry) -> observe_pb2.ResetRecord:
    return observe_pb2.ResetRecord(
        at=_timestamp(e.at),
        kind=_RESET_KIND.get(e.kind, common_pb2.RESET_KIND_UNSPECIFIED),
        automatic=e.automatic,
        reason=e.reason,
        fault=e.fault,
        inflight_jobs=e.inflight_jobs,
        recovered=e.recovered,
        failed=e.failed,
        generations_before=e.generations_before,
        generations_after=e.generations_after,
        health_before=_serving(e.serving_before, False),  # type: ignore[arg-type]
        health_after=_serving(e.serving_after, False),  # type: ignore[arg-type]
        ok=e.ok,
        message=e.message,
    )


def _resets_to_pb(s: StatusView) -> observe_pb2.ResetSummary:
    pb = observe_pb2.ResetSummary(
        count=s.resets,
        last_reason=s.last_reset_reason,
        budget=_budget(s.health.reset_budget),
        history=[_reset_record_to_pb(e) for e in s.reset_history],
    )
    if s.last_reset is not None:
        pb.last_kind = _RESET_KIND.get(s.last_reset.kind, common_pb2.RESET_KIND_UNSPECIFIED)
        pb.last_at.CopyFrom(_timestamp(s.last_reset.at))
        pb.last_ok = s.last_reset.ok
    return pb


def _model_to_pb(m: ModelView) -> observe_pb2.ModelStatus:
    return observe_pb2.ModelStatus(
        alias=m.alias,
        generation=m.generation,
        state=model_state_to_pb(m.state),  # type: ignore[arg-type]
        package_name=m.package_name,
        package_hash=m.package_hash,
        package_path=m.package_path,
        lanes=[_lane_to_pb(lane) for lane in m.lanes],
        queues=observe_pb2.QueueDepths(
            decode_ready=m.queues.decode_ready,
            short_prefill=m.queues.short_prefill,
            long_prefill=m.queues.long_prefill,
        ),
        ready_at=_timestamp(m.ready_at) if m.ready_at is not None else None,
        prefix_cache=_prefix_cache_to_pb(m.prefix_cache) if m.prefix_cache is not None else None,
        prefill_chunk_tokens=m.prefill_chunk_tokens,
        compiler=dict(m.compiler),
        calbin_sha256=m.calbin_sha256,
        memory=[
            observe_pb2.ModelChipMemory(
                chip=c.chip,
                planned_dram_bytes=c.planned_dram,
                planned_sram_bytes=c.planned_sram,
                dram_bytes=c.dram,
                sram_bytes=c.sram,
                measured=c.measured,
            )
            for c in m.memory
        ],
        slots=_slots_to_pb(m.slots) if m.slots is not None else None,
        prefill_offset=_prefill_offset_to_pb(m.prefill_offset) if m.prefill_offset is not None else None,
    )


def _job_to_pb(j: JobView) -> observe_pb2.JobSummary:
    job = observe_pb2.JobSummary(
        job_id=j.job_id,
        model=j.model,
        generation=j.generation,
        state=_JOB[j.state],
        prompt_tokens=j.prompt_tokens,
        completion_tokens=j.completion_tokens,
        priority=-j.priority,  # the wire's vLLM convention: lower is more urgent
        age_s=j.age_s,
        client_request_id=j.client_request_id,
    )
    if j.lane is not None:
        job.lane = j.lane
    return job


def status_to_pb(s: StatusView) -> observe_pb2.StatusResponse:
    device = _device_to_pb(s.device, s.memory)
    models = [_model_to_pb(m) for m in s.models]
    jobs = [_job_to_pb(j) for j in s.jobs]
    dc = s.device_counters
    return observe_pb2.StatusResponse(
        board=observe_pb2.BoardInfo(
            name=f"board{s.board}",
            index=s.board,
            daemon_version=_version(),
            started_at=_timestamp(s.started_at),
            driver=s.driver,
            fault_injection=s.fault_injection,
        ),
        device=device,
        models=models,
        jobs=jobs,
        device_counters=observe_pb2.DeviceJobCounters(
            submitted=dc.submitted, pending=dc.pending, running=dc.running, finished=dc.finished, left=dc.left
        ),
        job_counters=observe_pb2.JobCounters(
            accepted=s.accepted,
            rejected=s.rejected,
            completed=s.completed,
            cancelled=s.cancelled,
            failed=s.failed,
            recoveries=s.recoveries,
        ),
        buffer_pool=observe_pb2.BufferPoolStatus(
            in_use=s.pool.in_use, free=s.pool.free, quarantined=s.pool.quarantined, waits=s.pool.waits
        ),
        resets=_resets_to_pb(s),
        policy=observe_pb2.POLICY_SERIAL if s.policy == "serial" else observe_pb2.POLICY_CONTINUOUS,
        max_inflight=s.max_inflight,
        inflight_submissions=s.inflight,
        draining=s.draining,
        health=_serving(s.health.serving, s.health.draining, s.health.device_healthy),  # type: ignore[arg-type]
        utilization=utilization_to_pb(s.utilization),
        warnings=s.warnings,
    )


def utilization_to_pb(u: UtilizationView) -> observe_pb2.DeviceUtilization:
    return observe_pb2.DeviceUtilization(
        device_seconds=u.device_seconds,
        busy_seconds=u.busy_seconds,
        busy_ratio=u.busy_ratio,
        banks=[
            observe_pb2.BankUtilization(bank=_BANK[b.bank], busy_seconds=b.busy_seconds, busy_ratio=b.busy_ratio)
            for b in u.banks
        ],
        h2d_seconds=u.h2d_seconds,
        compute_seconds=u.compute_seconds,
        d2h_seconds=u.d2h_seconds,
        sampling_seconds=u.sampling_seconds,
        generated_tokens=u.generated_tokens,
        tokens_per_second=u.tokens_per_second,
        recent_busy_ratio=u.recent_busy_ratio,
        recent_window_seconds=u.recent_window_seconds,
        d2h_bytes=u.d2h_bytes,
        sampled_rows=u.sampled_rows,
        full_row_reads=u.full_row_reads,
        d2d_seconds=u.d2d_seconds,
        d2d_bytes=u.d2d_bytes,
    )


def load_report_to_pb(
    v: LoadView, sequence: int, now_unix: float, device_healthy: bool = True
) -> observe_pb2.LoadReport:
    return observe_pb2.LoadReport(
        board=v.board,
        timestamp=_timestamp(now_unix),
        status=_serving(v.serving, v.draining, device_healthy),  # type: ignore[arg-type]
        sequence=sequence,
        models=[
            observe_pb2.ModelLoad(
                alias=m.alias,
                generation=m.generation,
                state=model_state_to_pb(m.state),  # type: ignore[arg-type]
                ready=m.ready and v.serving,  # Submit is admitted only on a serving board
                queue_depth=m.queue_depth,
                running=m.running,
                free_lanes=m.free_lanes,
                lanes_total=m.lanes_total,
                parked_lanes=m.parked_lanes,
                pending_prefill_tokens=m.pending_prefill_tokens,
                prefix=_prefix_blocks_to_pb(m),
                package_hash=m.package_hash,
                pending_short_prefill_tokens=m.pending_short_prefill_tokens,
                short_prefill_tokens=m.short_prefill_tokens,
                queue_limit=m.queue_limit,
            )
            for m in v.models
        ],
    )


def model_info_to_pb(
    m: ModelInfoView, piece_bytes: int = TOKENIZER_PIECE_BYTES
) -> Iterator[observe_pb2.GetModelResponse]:
    """GetModel's stream: the summary, chat template, tokenizer size and the first piece of
    tokenizer.json, then one message for each further piece. No message carries more than
    `piece_bytes` of tokenizer.json and template together, but a longer template (inline in a
    manifest of at most 4 MiB) is never split: it comes with an empty first piece."""
    summary = observe_pb2.ModelSummary(
        alias=m.alias,
        generation=m.generation,
        state=model_state_to_pb(m.state),  # type: ignore[arg-type]
        package_name=m.package_name,
        package_hash=m.package_hash,
        model_role=m.model_role,
        family=m.family,
        quantization=m.quantization,
        vocab_size=m.vocab_size,
        context=m.context,
        lanes=m.lanes,
        eos_token_ids=list(m.eos_token_ids),
        model_max_length=m.model_max_length,
        prefill_fixed_ms=m.prefill_fixed_ms,
        prefill_ms_per_token=m.prefill_ms_per_token,
        decode_step_ms=m.decode_step_ms,
        prefill_chunk_tokens=m.prefill_chunk_tokens,
    )
    if m.bos_token_id is not None:
        summary.bos_token_id = m.bos_token_id
    if m.pad_token_id is not None:
        summary.pad_token_id = m.pad_token_id
    data = m.tokenizer_json
    first = max(0, piece_bytes - len(m.chat_template.encode("utf-8")))
    yield observe_pb2.GetModelResponse(
        model=summary, tokenizer_json=data[:first], chat_template=m.chat_template, tokenizer_size=len(data)
    )
    for start in range(first, len(data), piece_bytes):
        yield observe_pb2.GetModelResponse(tokenizer_json=data[start : start + piece_bytes])


def progress_to_pb(p: LoadProgress, elapsed_s: float) -> operate_pb2.LoadProgress:
    pb = operate_pb2.LoadProgress(
        state=model_state_to_pb(p.state),  # type: ignore[arg-type]
        generation=p.generation,
        message=p.message,
        done=p.done,
        elapsed_s=elapsed_s,
        bytes_done=p.bytes_done,
        bytes_total=p.bytes_total,
    )
    if p.error_kind is not None:
        pb.error.CopyFrom(error_status(p.error_kind, p.message))
    return pb


def reset_result_to_pb(
    report: ResetReport, reason: str, before: HealthView, after: HealthView, duration_s: float
) -> operate_pb2.ResetResult:
    """The audit record of one operator reset (operate.proto ResetResult)."""
    result = operate_pb2.ResetResult(
        ok=report.ok,
        kind=_RESET_KIND[report.kind],
        reason=reason,
        health_before=_serving(before.serving, before.draining, before.device_healthy),  # type: ignore[arg-type]
        health_after=_serving(after.serving, after.draining, after.device_healthy),  # type: ignore[arg-type]
        inflight_jobs=report.counts.inflight,
        recovered_jobs=report.counts.recovered,
        failed_jobs=report.counts.failed,
        duration_s=duration_s,
    )
    if report.kind == "configuration":
        now = {m.alias: m.generation for m in after.models}
        result.generations.extend(
            operate_pb2.GenerationChange(alias=m.alias, before=m.generation, after=now.get(m.alias, 0))
            for m in before.models
        )
    if report.error is not None:
        result.error.CopyFrom(error_status(report.error.kind, report.error.message))
    return result


def fault_from_pb(spec: operate_pb2.FaultSpec) -> Fault:
    """The calsim fault a FaultSpec plans (no trigger = the next submit attempt).

    Raises:
        InvalidArgument: unspecified kind, delay_ms on a kind other than SLOW_JOB, probability not
            in (0, 1] (calsim's own checks raise InvalidJob, also of kind INVALID_ARGUMENT).
    """
    kind = _FAULT.get(spec.kind)
    if kind is None:
        raise InvalidArgument("fault.kind: must be set")
    if kind is not FaultKind.SLOW_JOB and spec.delay_ms:
        raise InvalidArgument(f"fault.delay_ms: only for FAULT_KIND_SLOW_JOB, got {spec.delay_ms} for {kind.name}")
    trigger = spec.WhichOneof("trigger")
    if trigger == "probability" and not 0.0 < spec.probability <= 1.0:
        raise InvalidArgument(f"fault.probability: must be in (0, 1], got {spec.probability}")
    return Fault(
        kind,
        job=spec.job_index if trigger == "job_index" else None,
        probability=spec.probability if trigger == "probability" else None,
        delay_ms=float(spec.delay_ms),
    )


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("calculet")
    except PackageNotFoundError:
        return "0+unknown"


__all__ = [
    "TOKENIZER_PIECE_BYTES",
    "health_to_pb",
    "kind_to_pb",
    "load_report_to_pb",
    "model_info_to_pb",
    "progress_to_pb",
    "reset_result_to_pb",
    "status_to_pb",
]
