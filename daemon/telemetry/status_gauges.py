"""Observable instruments read from the daemon's Status view at each scrape (docs/metrics.md).

Data flow: a scrape takes one `StatusView` (the same snapshot the Status RPC builds: one engine
snapshot plus three cheap device queries, never under the engine lock) and every callback here reads
its figure from that view: requests running/waiting, KV lanes, queues, in-flight jobs, buffer pool,
device busy ratio, model state and generation, build and model info, device counters and memory (and
memory above its baseline, as last measured by the model manager).
Counters here (`*_total`) are cumulative values the daemon already keeps.

Each gauge is a row of `GAUGES`: (name, kind, unit, description, function of the view returning
(value, labels) pairs). `StatusGauges` creates them on a meter with one callback each.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from calculet.common.telemetry.registry import package_version
from calculet.daemon.core.kv import LaneState
from calculet.daemon.core.model_state import ModelState
from calculet.daemon.core.observe.status import PrefixCacheView, SlotView, StatusView

Labels = dict[str, str]
Points = Iterable[tuple[float, Labels]]


@dataclass(frozen=True)
class Gauge:
    """One observable instrument: `read(view)` gives its (value, labels) points."""

    name: str
    counter: bool
    unit: str
    description: str
    read: Callable[[StatusView], Points]


def _one(value: float) -> Points:
    return [(value, {})]


def _requests(view: StatusView, waiting: bool) -> Points:
    counts = {m.alias: 0 for m in view.models}
    for job in view.jobs:
        if (job.state == "WAITING") == waiting:
            counts[job.model] = counts.get(job.model, 0) + 1
    return [(n, {"model": alias}) for alias, n in counts.items()]


def _lanes(view: StatusView, what: str) -> Points:
    """Lanes used (held by a request), parked (a finished conversation's KV kept warm: free for
    admission) and total, per generation."""
    points = []
    for m in view.models:
        total = len(m.lanes)
        parked = sum(1 for lane in m.lanes if lane.state is LaneState.PARKED)
        used = total - parked - sum(1 for lane in m.lanes if lane.state is LaneState.FREE)
        ratio = used / total if total else 0.0
        value = {"used": used, "parked": parked, "total": total, "ratio": ratio}[what]
        points.append((value, {"model": m.alias, "generation": str(m.generation)}))
    return points


def _prefix(view: StatusView, read: Callable[[PrefixCacheView], int]) -> Points:
    """One prefix-reuse figure per configured generation."""
    return [
        (read(m.prefix_cache), {"model": m.alias, "generation": str(m.generation)})
        for m in view.models
        if m.prefix_cache is not None
    ]


def _slots(view: StatusView, read: Callable[[SlotView], float]) -> Points:
    """One decode-row figure per configured generation (`SlotView`)."""
    return [(read(m.slots), {"model": m.alias, "generation": str(m.generation)}) for m in view.models if m.slots]


def _decode_rows(view: StatusView) -> Points:
    points: list[tuple[float, Labels]] = []
    for m in view.models:
        if m.slots is not None:
            labels = {"model": m.alias, "generation": str(m.generation)}
            points.append((m.slots.active_rows, {**labels, "row": "active"}))
            points.append((m.slots.compiled_rows - m.slots.active_rows, {**labels, "row": "masked"}))
    return points


def _prefix_tokens(view: StatusView) -> Points:
    points: list[tuple[float, Labels]] = []
    for m in view.models:
        if m.prefix_cache is not None:
            labels = {"model": m.alias, "generation": str(m.generation)}
            points.append((m.prefix_cache.hit_tokens, {**labels, "result": "hit"}))
            points.append((m.prefix_cache.miss_tokens, {**labels, "result": "miss"}))
    return points


def _prefill_offset(view: StatusView) -> Points:
    """Per decided generation: 1 when it prefills at an offset (chunks, prefix reuse), 0 when not;
    the verdict (proven, refuted, undeclared) says why."""
    return [
        (1.0 if d.allowed else 0.0, {"model": m.alias, "generation": str(m.generation), "verdict": d.verdict.value})
        for m in view.models
        if (d := m.prefill_offset) is not None
    ]


def _queues(view: StatusView) -> Points:
    points = []
    for m in view.models:
        q = m.queues
        for name, depth in (("decode_ready", q.decode_ready), ("short_prefill", q.short_prefill),
                            ("long_prefill", q.long_prefill)):  # fmt: skip
            points.append((depth, {"model": m.alias, "generation": str(m.generation), "queue": name}))
    return points


def _model_states(view: StatusView) -> Points:
    """1 for each published alias's state, 0 for its other states (so a change shows as 1 -> 0)."""
    return [
        (1.0 if m.state is state else 0.0, {"model": m.alias, "state": state.value})
        for m in view.models
        if m.published
        for state in ModelState
    ]


def _model_info(view: StatusView) -> Points:
    points = []
    for m in view.models:
        labels = {"model": m.alias, "generation": str(m.generation), "package": m.package_name}
        points.append((1.0, {**labels, "calbin_hash": m.package_hash, "state": m.state.value}))
    return points


def _build_info(view: StatusView) -> Points:
    d = view.device
    labels = {
        "version": package_version(), "board": str(view.board), "binding": view.driver, "device": d.name,
        "runtime": d.runtime_version, "driver": d.driver_version, "firmware": d.firmware_version,
        "policy": view.policy,
    }  # fmt: skip
    return [(1.0, labels)]


def _memory(view: StatusView) -> Points:
    points = []
    for c in view.memory.chips:
        for memory, used, total in (("dram", c.dram_used, c.dram_total), ("sram", c.sram_used, c.sram_total)):
            points.append((used, {"chip": str(c.chip), "memory": memory, "use": "used"}))
            points.append((total, {"chip": str(c.chip), "memory": memory, "use": "total"}))
    return points


def _model_memory(view: StatusView) -> Points:
    """Per resident model and chip, DRAM and SRAM bytes: the planner's and the device's measured."""
    points = []
    for m in view.models:
        labels = {"model": m.alias, "generation": str(m.generation)}
        for c in m.memory:
            chip = {**labels, "chip": str(c.chip)}
            points.append((c.planned_dram, {**chip, "memory": "dram", "source": "planned"}))
            points.append((c.planned_sram, {**chip, "memory": "sram", "source": "planned"}))
            if c.measured:
                points.append((c.dram, {**chip, "memory": "dram", "source": "measured"}))
                points.append((c.sram, {**chip, "memory": "sram", "source": "measured"}))
    return points


def _memory_above_baseline(view: StatusView) -> Points:
    """Per chip, bytes held above its baseline when last measured (0 on a chip that holds no more)."""
    points = []
    for c in view.memory_excess:
        points.append((c.dram, {"chip": str(c.chip), "memory": "dram"}))
        points.append((c.sram, {"chip": str(c.chip), "memory": "sram"}))
    return points


def _device_jobs(view: StatusView) -> Points:
    c = view.device_counters
    return [(c.pending, {"state": "pending"}), (c.running, {"state": "running"}), (c.left, {"state": "left"})]


GAUGES: tuple[Gauge, ...] = (
    Gauge("calculet_requests_running", False, "", "Requests holding a KV lane", lambda v: _requests(v, False)),
    Gauge("calculet_requests_waiting", False, "", "Requests queued for a KV lane", lambda v: _requests(v, True)),
    Gauge("calculet_kv_lane_usage_ratio", False, "1", "KV lanes held by requests / lanes",
          lambda v: _lanes(v, "ratio")),
    Gauge("calculet_kv_lanes_used", False, "", "KV lanes held by requests", lambda v: _lanes(v, "used")),
    Gauge("calculet_kv_lanes_parked", False, "", "KV lanes keeping a finished job's KV (count as free)",
          lambda v: _lanes(v, "parked")),
    Gauge("calculet_kv_lanes_total", False, "", "KV lanes of the model", lambda v: _lanes(v, "total")),
    Gauge("calculet_prefix_cache_tokens_total", True, "",
          "Prompt tokens served from parked KV (hit) or prefilled (miss)", _prefix_tokens),
    Gauge("calculet_prefix_cache_hits_total", True, "", "Requests that took a parked lane's prefix",
          lambda v: _prefix(v, lambda p: p.hits)),
    Gauge("calculet_prefix_cache_misses_total", True, "", "Requests that took a lane cold",
          lambda v: _prefix(v, lambda p: p.misses)),
    Gauge("calculet_prefix_cache_evictions_total", True, "", "Parked lanes emptied for a request (LRU)",
          lambda v: _prefix(v, lambda p: p.evictions)),
    Gauge("calculet_prefix_cache_dropped_total", True, "", "Parked lanes dropped after a reset or fault",
          lambda v: _prefix(v, lambda p: p.dropped)),
    Gauge("calculet_decode_rows_total", True, "", "Rows of decode jobs: active, or masked (compiled batch padding)",
          _decode_rows),
    Gauge("calculet_decode_batch_fill_ratio", False, "1", "Active rows / compiled rows of the decode jobs so far",
          lambda v: _slots(v, lambda s: s.fill)),
    Gauge("calculet_slot_compactions_total", True, "",
          "Sequences moved to a lower fixed slot by re-prefill (no lane selection)",
          lambda v: _slots(v, lambda s: s.compactions)),
    Gauge("calculet_model_prefill_offset", False, "",
          "1 where the generation prefills at an offset (chunked prefill, prefix reuse), 0 where not",
          _prefill_offset),
    Gauge("calculet_queue_depth", False, "", "Scheduler queues", _queues),
    Gauge("calculet_inflight_jobs", False, "", "Device jobs in flight", lambda v: _one(v.inflight)),
    Gauge("calculet_inflight_limit", False, "", "Device jobs allowed in flight", lambda v: _one(v.max_inflight)),
    Gauge("calculet_buffer_pool_in_use", False, "", "Job contexts in use", lambda v: _one(v.pool.in_use)),
    Gauge("calculet_buffer_pool_free", False, "", "Job contexts free", lambda v: _one(v.pool.free)),
    Gauge("calculet_buffer_pool_quarantined", False, "", "Job contexts quarantined",
          lambda v: _one(v.pool.quarantined)),
    Gauge("calculet_buffer_pool_waits_total", True, "", "Context acquisitions that found none free",
          lambda v: _one(v.pool.waits)),
    Gauge("calculet_engine_busy_ratio", False, "1", "Compute seconds of the bank's jobs / device seconds",
          lambda v: [(b.busy_ratio, {"bank": b.bank.value}) for b in v.utilization.banks]),
    Gauge("calculet_engine_busy_seconds_total", True, "s", "Compute seconds of the bank's jobs (device clock)",
          lambda v: [(b.busy_seconds, {"bank": b.bank.value}) for b in v.utilization.banks]),
    Gauge("calculet_device_busy_ratio", False, "1", "Compute busy / device seconds since the first job",
          lambda v: _one(v.utilization.busy_ratio)),
    Gauge("calculet_device_recent_busy_ratio", False, "1", "Device busy ratio over the recent window",
          lambda v: _one(v.utilization.recent_busy_ratio)),
    Gauge("calculet_device_busy_seconds_total", True, "s", "Union of compute intervals (device clock)",
          lambda v: _one(v.utilization.busy_seconds)),
    Gauge("calculet_device_clock_seconds_total", True, "s", "Device clock span since the first job",
          lambda v: _one(v.utilization.device_seconds)),
    Gauge("calculet_device_d2d_seconds_total", True, "s", "Compute seconds spent on the chip link (device clock)",
          lambda v: _one(v.utilization.d2d_seconds)),
    Gauge("calculet_device_d2d_bytes_total", True, "By", "Bytes moved between chips",
          lambda v: _one(v.utilization.d2d_bytes)),
    Gauge("calculet_generation_tokens_per_second", False, "", "Tokens per wall second over the recent window",
          lambda v: _one(v.utilization.tokens_per_second)),
    Gauge("calculet_model_state", False, "", "1 for the published generation's state", _model_states),
    Gauge("calculet_model_generation", False, "", "Published generation of the alias",
          lambda v: [(m.generation, {"model": m.alias}) for m in v.models if m.published]),
    Gauge("calculet_model_info", False, "", "Every loaded generation and its package", _model_info),
    Gauge("calculet_build_info", False, "", "Daemon and device versions", _build_info),
    Gauge("calculet_device_jobs", False, "", "Device job counters now", _device_jobs),
    Gauge("calculet_device_jobs_submitted_total", True, "", "Jobs the device accepted",
          lambda v: _one(v.device_counters.submitted)),
    Gauge("calculet_device_jobs_finished_total", True, "", "Jobs the device finished",
          lambda v: _one(v.device_counters.finished)),
    Gauge("calculet_device_memory_bytes", False, "By", "Chip memory", _memory),
    Gauge("calculet_model_memory_bytes", False, "By", "A resident model's chip memory, planned and measured",
          _model_memory),
    Gauge("calculet_device_memory_above_baseline_bytes", False, "By",
          "Chip memory held by no configured model (above what the chip held when opened)", _memory_above_baseline),
    Gauge("calculet_submit_refusals_total", True, "", "Submits refused, any reason", lambda v: _one(v.rejected)),
    Gauge("calculet_recoveries_total", True, "", "Re-prefills after lost KV", lambda v: _one(v.recoveries)),
    Gauge("calculet_board_serving", False, "", "1 while the board serves", lambda v: _one(float(v.health.serving))),
    Gauge("calculet_board_draining", False, "", "1 while the board drains", lambda v: _one(float(v.draining))),
)  # fmt: skip


class StatusGauges:
    """Creates every `GAUGES` instrument on `meter`; their callbacks read `view()` (None: no points,
    e.g. a collection outside a scrape)."""

    def __init__(self, meter: Meter, view: Callable[[], StatusView | None]) -> None:
        self._view = view
        for gauge in GAUGES:
            create = meter.create_observable_counter if gauge.counter else meter.create_observable_gauge
            create(gauge.name, callbacks=[self._callback(gauge)], unit=gauge.unit, description=gauge.description)

    def _callback(self, gauge: Gauge) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observe(_: CallbackOptions) -> Iterable[Observation]:
            view = self._view()
            return [] if view is None else [Observation(value, labels) for value, labels in gauge.read(view)]

        return observe
