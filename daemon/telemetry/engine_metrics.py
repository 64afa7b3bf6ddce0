"""`EngineMetrics`: the engine's events (`core/observe/observer.py`) recorded as OpenTelemetry counters and
histograms (docs/metrics.md lists each one).

Data flow: the engine emits an event -> the observer hub's thread calls a method here -> histograms
are recorded into the daemon's `MetricsRegistry`, counters are added to plain totals (`Totals`) that
OpenTelemetry observable counters read at each scrape -> a scrape renders them. A push `Counter.add`
of the OTel Python SDK costs about as much as a histogram recording (~15-25 us on our 2-core boxes:
attribute validation, hashing, a lock), and a counter needs no per-value state, so counts stay plain
integers until a scrape asks. Everything but `Totals.observe` runs on the hub thread, so the
per-request state (`_last`, the time of each live request's latest token, for the inter-token
latency) needs no lock; a request's entry goes with its Final.

Request latencies come from the timings the request's Final reports (TTFT, e2e, queue, time per output
token), so a histogram and a client's own `timings` always agree. Per-phase job times come from the
device's own timestamps (`JobTimestamps`, device clock), sampling and postprocess from host clocks.
Warm-up probes (`internal`) count in the device-job metrics, never in the request metrics.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping

from opentelemetry.metrics import CallbackOptions, Histogram, Meter, Observation

from calculet.common.telemetry.registry import LATENCY_BUCKETS_S, RATIO_BUCKETS
from calculet.daemon.core.observe.observer import (
    DeviceJobDone,
    EngineObserver,
    FaultSeen,
    RequestFinished,
    RequestRejected,
    ResetRecorded,
)
from calculet.daemon.device.types import TaskType

# Counter name -> description; each is an observable counter over `Totals`.
COUNTERS = {
    "calculet_requests_total": "Finished requests, by model and finish reason",
    "calculet_request_errors_total": "Requests ended by an error, by model and error kind",
    "calculet_prompt_tokens_total": "Prompt tokens of finished requests",
    "calculet_generation_tokens_total": "Tokens generated for requests",
    "calculet_admission_rejections_total": "Submits refused by admission, by reason",
    "calculet_device_resets_total": "Device resets, by kind, reason and result",
    "calculet_escalations_total": "Escalations that are not resets (the board drained itself), by kind and reason",
    "calculet_faults_total": "Device faults, by kind",
    "calculet_model_switches_total": "Model switches (a Load replacing a generation), by result",
    "calculet_board_drains_total": "Operator drains and resumes and shutdown drains, by action and reason",
}


class Totals:
    """Cumulative counts per (counter, labels), added on one thread and read by scrapes on others."""

    def __init__(self) -> None:
        self._counts: dict[str, dict[tuple[tuple[str, str], ...], float]] = {name: {} for name in COUNTERS}
        self._lock = threading.Lock()  # a scrape copies while the hub thread adds

    def add(self, name: str, labels: tuple[tuple[str, str], ...], amount: float = 1) -> None:
        counts = self._counts[name]
        with self._lock:
            counts[labels] = counts.get(labels, 0) + amount

    def observe(self, name: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
        """The observable counter callback of `name`."""

        def callback(_: CallbackOptions) -> Iterable[Observation]:
            with self._lock:
                items = list(self._counts[name].items())
            return [Observation(value, dict(labels)) for labels, value in items]

        return callback


class EngineMetrics(EngineObserver):
    """Records the engine's events into instruments created on `meter`."""

    def __init__(self, meter: Meter) -> None:
        def seconds(name: str, description: str) -> Histogram:
            return meter.create_histogram(
                name, unit="s", description=description, explicit_bucket_boundaries_advisory=LATENCY_BUCKETS_S
            )

        self._ttft = seconds("calculet_time_to_first_token_seconds", "Submit to the first token this daemon produced")
        self._itl = seconds("calculet_inter_token_latency_seconds", "Between consecutive tokens of one request")
        self._tpot = seconds("calculet_time_per_output_token_seconds", "Per request: decode time / (tokens - 1)")
        self._e2e = seconds("calculet_e2e_request_latency_seconds", "Submit to the Final")
        self._queue = seconds("calculet_queue_time_seconds", "Submit to a KV lane (admission)")
        self._phase = seconds("calculet_job_phase_seconds", "Device job phases (device clock; sampling on the host)")
        self._fill = meter.create_histogram(
            "calculet_batch_fill_ratio", unit="1", description="Decode job rows / the submodel's batch",
            explicit_bucket_boundaries_advisory=RATIO_BUCKETS,
        )  # fmt: skip
        self.totals = Totals()
        for name, description in COUNTERS.items():
            meter.create_observable_counter(name, callbacks=[self.totals.observe(name)], description=description)
        self._last: dict[str, float] = {}  # live request -> monotonic time of its latest token

    def request_finished(self, event: RequestFinished) -> None:
        self._last.pop(event.job_id, None)
        if event.internal:
            return
        model = (("model", event.model),)
        add = self.totals.add
        add("calculet_requests_total", (*model, ("finish", event.reason.value)))
        if event.error_kind is not None:
            add("calculet_request_errors_total", (*model, ("kind", event.error_kind.value)))
        add("calculet_prompt_tokens_total", model, event.usage.prompt_tokens)
        produced = event.usage.completion_tokens - event.usage.resumed_tokens
        t, attrs = event.timings, {"model": event.model}
        if produced > 0:
            self._ttft.record(t.ttft, attrs)
        if produced > 1:
            self._tpot.record(t.decode / (produced - 1), attrs)
        self._e2e.record(t.e2e, attrs)
        self._queue.record(t.queue, attrs)

    def device_job_done(self, event: DeviceJobDone) -> None:
        task = event.task.value
        stamps = event.stamps
        if stamps is not None:
            for phase, value in (("h2d", stamps.h2d), ("compute", stamps.compute), ("d2h", stamps.d2h)):
                self._phase.record(value, _phase(phase, task))
        if event.sampling_s > 0:
            self._phase.record(event.sampling_s, _phase("sampling", task))
        self._phase.record(event.postprocess_s, _phase("postprocess", task))
        if event.task is TaskType.DECODE and event.batch > 0:
            self._fill.record(len(event.rows) / event.batch)
        self._tokens(event)
        for kind in event.faults:
            self.totals.add("calculet_faults_total", (("kind", kind),))

    def _tokens(self, event: DeviceJobDone) -> None:
        """Generated tokens and inter-token latencies of the job's client rows."""
        produced = 0
        attrs = {"model": event.model}
        for row in event.rows:
            if not row.token or row.internal:
                continue
            produced += 1
            last = self._last.get(row.job_id)
            if last is not None and not row.first:
                self._itl.record(event.t_done - last, attrs)
            self._last[row.job_id] = event.t_done
        if produced:
            self.totals.add("calculet_generation_tokens_total", (("model", event.model),), produced)

    def request_rejected(self, event: RequestRejected) -> None:
        self.totals.add("calculet_admission_rejections_total", (("model", event.model), ("reason", event.reason)))

    def reset_recorded(self, event: ResetRecorded) -> None:
        e = event.entry
        if e.kind == "switch":  # an operator's or a gateway's switch, audited: not a reset
            self.totals.add("calculet_model_switches_total", (("result", "ok" if e.ok else "failed"),))
            return
        if not e.automatic and e.kind in OPERATOR_ACTIONS:  # an operator's (or a shutdown's) drain or resume
            self.totals.add("calculet_board_drains_total", (("action", e.kind), ("reason", e.reason)))
            return
        if e.kind in ESCALATIONS_WITHOUT_RESET:  # the audit trail holds escalations too; these reset nothing
            self.totals.add("calculet_escalations_total", (("kind", e.kind), ("reason", e.fault)))
            return
        labels = (("kind", e.kind), ("reason", e.fault), ("result", "ok" if e.ok else "failed"))
        self.totals.add("calculet_device_resets_total", labels)

    def fault_seen(self, event: FaultSeen) -> None:
        self.totals.add("calculet_faults_total", (("kind", event.kind),))


ESCALATIONS_WITHOUT_RESET = ("drain", "quarantine", "restart", "unload")  # audit kinds counted as escalations
OPERATOR_ACTIONS = ("drain", "resume")  # audit kinds an operator causes too (not automatic)
_PHASES: dict[tuple[str, str], Mapping[str, str]] = {}


def _phase(phase: str, task: str) -> Mapping[str, str]:
    """The attributes of one (phase, task) series, built once."""
    key = (phase, task)
    attrs = _PHASES.get(key)
    if attrs is None:
        attrs = _PHASES[key] = {"phase": phase, "task": task}
    return attrs
