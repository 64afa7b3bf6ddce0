"""`DeviceCore`: the daemon's domain API, one object per board, no transport (DEVELOPERS.md rule 1).

It opens the device through the driver registry, owns the `Engine` (scheduling, execution,
completion) and the `ModelManager` (lifecycle), and answers the three planes of DESIGN.md
section 6 with domain objects. The gRPC servicer converts protobuf to these calls and back, nothing
more. Thread-safe: methods may be called from any thread; long operations (load, unload, drain)
block the caller, never the engine threads.
"""

from __future__ import annotations

import hashlib
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from calculet.daemon.core.engine import Engine, EngineConfig
from calculet.daemon.core.events import EventLog
from calculet.daemon.core.model_state import ModelState
from calculet.daemon.core.models import LoadProgress, ModelManager, ProgressFn
from calculet.daemon.core.request import GenerationRequest, ModelLimits
from calculet.daemon.core.reset_budget import SETTLE_TIMEOUT_S, ResetReport
from calculet.daemon.core.runtime import ModelRuntime
from calculet.daemon.core.scheduler import SchedulingPolicy
from calculet.daemon.core.sequence import SeqState
from calculet.daemon.core.status import (
    HealthView,
    JobView,
    LoadView,
    ModelHealthView,
    ModelInfoView,
    ModelLoadView,
    ModelView,
    PoolView,
    QueueView,
    StatusView,
)
from calculet.daemon.device.api import VirtualDevice
from calculet.daemon.device.errors import DeviceError, DeviceLost
from calculet.daemon.device.registry import load_driver
from calculet.daemon.device.types import DeviceCapabilities, DeviceInfo, JobCounters, MemoryUsage
from calculet.daemon.errors import CalculetError, FailedPrecondition, InvalidArgument, NotFound, Unavailable
from calculet.daemon.package.manifest import MANIFEST_NAME

log = logging.getLogger(__name__)

POLICIES = ("continuous", "serial")
CLOSE_SETTLE_S = 2.0  # at close, how long device jobs in flight may take before they count as hung
_LOST_INFO = DeviceInfo("lost", 0, (), "", "", "", DeviceCapabilities(0, False, 0, False))


@dataclass(frozen=True)
class DaemonConfig:
    """Everything the daemon is started with (flags and config file, already merged).

    Attributes:
        board: board index on this host.
        device: driver name in the `calculet.devices` entry point group.
        device_options: driver options (calsim: time_scale, fault_plan, ...).
        models_root: package paths given to Load must resolve inside it.
        models: startup models as (alias, path relative to models_root or absolute inside it).
        policy: "continuous" (batching, ping/pong) or "serial" (today's product, for comparison).
        max_inflight: 1 or 2 (capped by the device's capability).
        job_timeout_s: wall-clock wait for one device job before the device is reset.
        fault_injection: allow the InjectFault RPC (calsim only).
        drain_timeout_s: default drain/unload timeout.
        orphan_timeout_s: cancel a job that has had no Wait stream for this long (None = never).
        retention_bytes: estimated bytes of finished jobs kept for Wait re-attach and Submit retries
            (oldest evicted first; 0 keeps none).
        retention_s: seconds a finished job is kept at most after its Final.
    """

    board: int = 0
    device: str = "calsim"
    device_options: dict[str, Any] = field(default_factory=dict)
    models_root: Path = Path(".")
    models: tuple[tuple[str, str], ...] = ()
    policy: str = "continuous"
    max_inflight: int = 2
    job_timeout_s: float = 30.0
    fault_injection: bool = False
    drain_timeout_s: float = 30.0
    queue_depth: int = 1024
    admission_timeout_s: float = 30.0
    decode_jobs_per_model: int = 1
    orphan_timeout_s: float | None = 60.0
    retention_bytes: int = 256 * 1024 * 1024
    retention_s: float = 600.0

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise InvalidArgument(f"policy: must be one of {', '.join(POLICIES)}, got {self.policy!r}")
        if self.max_inflight not in (1, 2):
            raise InvalidArgument(f"max_inflight: must be 1 or 2, got {self.max_inflight}")
        if self.decode_jobs_per_model not in (1, 2):
            raise InvalidArgument(f"decode_jobs_per_model: must be 1 or 2, got {self.decode_jobs_per_model}")
        if self.job_timeout_s <= 0:
            raise InvalidArgument(f"job_timeout_s: must be positive, got {self.job_timeout_s}")
        if self.retention_bytes < 0:
            raise InvalidArgument(f"retention_bytes: must be >= 0, got {self.retention_bytes}")
        if not (math.isfinite(self.retention_s) and self.retention_s > 0):
            raise InvalidArgument(f"retention_s: must be a positive number of seconds, got {self.retention_s}")

    def engine_config(self) -> EngineConfig:
        serial = self.policy == "serial"
        policy = SchedulingPolicy(
            max_active=1 if serial else 1 << 30,
            queue_depth=self.queue_depth,
            admission_timeout_s=self.admission_timeout_s,
            decode_jobs_per_model=self.decode_jobs_per_model,
        )
        return EngineConfig(
            policy=policy,
            max_inflight=1 if serial else self.max_inflight,
            synchronous=serial,
            job_timeout_s=self.job_timeout_s,
            orphan_timeout_s=self.orphan_timeout_s,
            retention_bytes=self.retention_bytes,
            retention_s=self.retention_s,
        )


@dataclass(frozen=True)
class SubmitResult:
    job_id: str
    deduplicated: bool
    seed: int
    generation: int


class DeviceCore:
    """One board: device, engine, models."""

    def __init__(self, config: DaemonConfig, device: VirtualDevice | None = None) -> None:
        self.config = config
        self.device = device or load_driver(config.device).open(config.board, config.device_options)
        self.engine = Engine(self.device, config.engine_config())
        self.models = ModelManager(self.engine, self.device, config.models_root, drain_timeout_s=config.drain_timeout_s)
        self.started_at = time.time()
        self._last_info: DeviceInfo | None = self.device.info()
        self._closed = False
        self._close_lock = threading.Lock()
        self._hashes: dict[tuple[str, int], str] = {}  # (alias, generation) -> manifest SHA-256

    # ---- lifecycle --------------------------------------------------------------------------

    def start(self, progress: ProgressFn | None = None) -> None:
        """Start the engine and load the startup models (raises if one fails)."""
        self.engine.start()
        for alias, path in self.config.models:
            self.models.load(alias, path, progress)

    def end_unfinished(self, reason: str) -> int:
        """Stop admitting and end every unfinished job now with an in-band Final ERROR / UNAVAILABLE
        (shutdown, once the drain window is over; see `Engine.end_unfinished`).

        Returns:
            How many jobs it ended.
        """
        self.stop_admitting()
        return self.engine.end_unfinished(reason)

    def close(self, settle_s: float = CLOSE_SETTLE_S) -> None:
        """Stop serving and release the device, without waiting for a device job that hangs.

        Every unfinished job ends at once with an in-band Final ERROR / UNAVAILABLE. Device jobs
        still in flight get `settle_s` (at most the job timeout) to complete, as a healthy one does
        within a step or two; then the models are retired and their buffers released. A job still on
        the device after that is treated as hung and not waited for: it keeps its buffers (nothing is
        launched any more, so nothing reuses them) and the device's `close` ends it.
        """
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        self.end_unfinished("board closed: resume on another board")
        with self.engine.cond:
            self.engine.health_listeners.clear()  # the transport is gone: nobody to tell any more
        if self.engine.wait_device_idle(min(settle_s, self.config.job_timeout_s)):
            self._retire_all()
            self.engine.stop()
            self.device.close()
            return
        log.warning("closing with device job(s) still in flight after %.1fs: not waiting for them", settle_s)
        self.engine.stop(timeout=0.0)
        self.device.close()  # ends what the device still holds, which wakes the completion thread
        if not self.engine.stop(timeout=settle_s):
            log.warning("an engine thread is still waiting on the closed device; exiting without it")

    def _retire_all(self) -> None:
        """Retire every Ready generation (no job is left, so nothing waits)."""
        for rt in reversed(self.models.all()):
            try:
                if rt.state is ModelState.READY:
                    self.models.retire(rt, timeout=0.0)
            except Exception:  # keep closing the rest; the process is exiting
                log.exception("closing model %s generation %s", rt.alias, rt.generation)

    # ---- inference plane --------------------------------------------------------------------

    def submit(self, req: GenerationRequest, *, seed_given: bool = True) -> SubmitResult:
        """Queue a request (see `Engine.submit_sequence`); `seed_given` False: the seed was drawn for it.

        Raises:
            As `Engine.submit_sequence`.
        """
        seq, dedup = self.engine.submit_sequence(req, seed_given=seed_given)
        return SubmitResult(seq.job_id, dedup, seq.request.sampling.seed, seq.generation)

    def count_rejected(self) -> None:
        """Count a refused Submit in Status's `rejected` (the transport calls it for every refusal)."""
        self.engine.count_rejected()

    def serving_limits(self, alias: str) -> ModelLimits | None:
        """The limits a Submit to `alias` is checked against: those of its serving generation, or None
        when none serves (unknown, loading, unloaded: `submit` refuses it for that). O(1).
        """
        with self.engine.cond:  # a published runtime keeps its model until it is unpublished
            rt = self.engine.aliases.get(alias)
            return rt.limits if rt is not None and rt.model is not None and rt.state.serving else None

    def largest_context(self) -> int:
        """The largest context of any model loaded here, in any state (0 with none). O(models)."""
        return max((rt.manifest.context for rt in self.models.all()), default=0)

    def default_max_tokens(self, alias: str) -> int:
        """The room left by a prompt is computed per request; this is the model's context."""
        rt = self.models.serving(alias)
        return rt.limits.context if rt is not None and rt.model is not None else 1

    def event_log(self, job_id: str, *, for_wait: bool = True) -> EventLog:
        return self.engine.event_log(job_id, for_wait=for_wait)

    def job_generation(self, job_id: str) -> tuple[int, int]:
        seq = self.engine.sequence(job_id)
        return (seq.generation, seq.recoveries) if seq is not None else (0, 0)

    def cancel(self, job_id: str) -> bool:
        return self.engine.cancel(job_id)

    # ---- operations plane ---------------------------------------------------------------------

    def load(
        self,
        alias: str,
        path: str,
        progress: ProgressFn | None = None,
        replace: bool = False,
        lanes: int | None = None,
        drain_timeout_s: float | None = None,
    ) -> ModelRuntime:
        return self.models.load(alias, path, progress, replace=replace, lanes=lanes, drain_timeout_s=drain_timeout_s)

    def unload(self, alias: str, timeout_s: float | None = None) -> ModelRuntime:
        """Drain and release the alias's generation; the returned runtime counts drained/cut jobs."""
        return self.models.unload(alias, self.config.drain_timeout_s if timeout_s is None else timeout_s)

    def drain(self, timeout_s: float | None = None, interrupt: bool = False) -> tuple[bool, int, int]:
        """Stop admitting and wait for running work. Returns (drained, remaining, interrupted)."""
        self.stop_admitting()
        return self.wait_drained(timeout_s, interrupt)

    def stop_admitting(self) -> None:
        with self.engine.cond:
            self.engine.admitting = False
            self.engine.cond.notify_all()

    def wait_drained(self, timeout_s: float | None = None, interrupt: bool = False) -> tuple[bool, int, int]:
        """Wait until no job is left; optionally cancel what remains after the timeout."""
        timeout = self.config.drain_timeout_s if timeout_s is None else timeout_s
        engine = self.engine
        with engine.cond:
            deadline = time.monotonic() + timeout
            while engine.sequences and (left := deadline - time.monotonic()) > 0:
                engine.cond.wait(left)
            remaining = len(engine.sequences)
        interrupted = 0
        if remaining and interrupt:
            for rt in self.models.all():
                interrupted += engine.cancel_generation(rt.generation, "board drained")
        return remaining == 0, remaining, interrupted

    def resume(self) -> bool:
        """Admit again after a drain. Returns whether the board was draining."""
        with self.engine.cond:
            was = not self.engine.admitting
            self.engine.admitting = not self.engine.device_lost
            self.engine.cond.notify_all()
            return was

    def reset(self, kind: str, reason: str, model: str = "") -> tuple[bool, str]:
        """`operator_reset` without waiting for the jobs it hit to recover. Returns (ok, message).

        Raises:
            As `operator_reset`, and its report's error when the reset did not succeed.
        """
        report = self.operator_reset(kind, reason, model, settle_timeout_s=0.0)
        if report.error is not None:
            raise report.error
        return report.ok, report.message

    def operator_reset(
        self, kind: str, reason: str, model: str = "", settle_timeout_s: float | None = None
    ) -> ResetReport:
        """Operator reset, one at a time. kind: "ccu" (in-flight jobs end as CCU exceptions; their
        sequences re-prefill) or "configuration" (the KV of `model`, or of every model when empty, is
        cleared; its sequences re-prefill). Neither is a device anomaly. A successful one lifts a halt
        for a used-up automatic reset budget, clears the budget and restores the in-flight limit.

        Args:
            settle_timeout_s: how long to wait for the jobs it hit to rebuild their KV or end before
                counting them (None: `SETTLE_TIMEOUT_S`). The reset is in progress until then.

        Returns:
            The report: ok, or not with the error (the device failed the reset, or the board still
            cannot serve); the jobs it hit and their fate.

        Raises:
            InvalidArgument: unknown kind, or a model named for a CCU reset.
            NotFound: `model` is not loaded.
            FailedPrecondition: another reset is in progress (nothing was done).
        """
        if kind not in ("ccu", "configuration"):
            raise InvalidArgument(f"reset kind must be ccu or configuration, got {kind!r}")
        if model and kind != "configuration":
            raise InvalidArgument("model: only a configuration reset can be limited to one model")
        targets = self.models.all()
        if model:
            serving = self.models.serving(model)
            if serving is None:
                raise NotFound(f"model {model!r} is not loaded")
            targets = [serving]
        engine = self.engine
        tally = engine.begin_operator_reset(kind, reason)
        try:
            problem: CalculetError | None
            try:
                message = self._reset_device(kind, targets)
                problem = engine.operator_reset_succeeded()
            except DeviceError as exc:  # attempted, and the device failed it: the outcome is the answer
                message, problem = f"{kind} reset failed", exc
            settle = SETTLE_TIMEOUT_S if settle_timeout_s is None else settle_timeout_s
            counts = engine.wait_reset_settled(tally, settle if problem is None else 0.0)
            engine.note_reset_outcome(kind, problem is None)
        finally:
            engine.end_reset()
        if problem is not None:
            return ResetReport(kind, False, f"{message}: {problem}", counts, problem)
        return ResetReport(kind, True, message, counts)

    def _reset_device(self, kind: str, targets: list[ModelRuntime]) -> str:
        """The device part of an operator reset. Returns what was done.

        Raises:
            DeviceError: the device failed the reset.
        """
        if kind == "ccu":
            self.engine.operator_reset_ccu()
            return "compute units reset"
        for rt in targets:
            if rt.model is not None:
                self.engine.reset_configuration(rt, "configuration reset")
        names = ", ".join(rt.alias for rt in targets) or "none"
        return f"configuration reset ({names}); their sequences re-prefill"

    def inject_fault(self, fault: Any) -> Any:
        """Add a fault to calsim's plan (only when the daemon was started with fault injection)."""
        return self._fault_hook("inject")(fault)

    def clear_faults(self) -> None:
        self._fault_hook("clear_faults")()

    def next_job_index(self) -> int:
        return int(self._fault_hook("next_job_index")())

    def planned_faults(self) -> int:
        return len(self._fault_hook("fault_plan")()["faults"])

    def _fault_hook(self, name: str) -> Any:
        if not self.config.fault_injection:
            raise FailedPrecondition("fault injection is disabled (start the daemon with --fault-injection)")
        hook = getattr(self.device, name, None)
        if hook is None:
            raise FailedPrecondition(f"device {self.config.device!r} does not support fault injection")
        return hook

    # ---- observation plane ------------------------------------------------------------------

    def health(self) -> HealthView:
        engine = self.engine
        healthy = self.device.healthy() and not engine.device_lost
        with engine.cond:
            draining = healthy and not engine.admitting
            models = tuple(
                ModelHealthView(rt.alias, rt.generation, rt.state)
                for rt in sorted(engine.aliases.values(), key=lambda r: r.alias)
            )
            budget = engine.reset_budget.view()
        ready = any(m.state.serving for m in models)
        if not healthy:
            reason = "automatic reset budget exhausted" if budget.exhausted else "device lost or unusable"
        elif draining:
            reason = "draining"
        elif not ready:
            reason = "no model is ready"
        else:
            reason = ""
        return HealthView(reason == "", draining, healthy, models, budget, reason)

    def on_health_change(self, listener: Callable[[], None]) -> None:
        """Call `listener()` (from an engine thread; it must not block) when the board stops
        serving on its own: device lost, automatic reset budget used up, a crashed device thread."""
        with self.engine.cond:
            self.engine.health_listeners.append(listener)

    def status(self) -> StatusView:
        engine = self.engine
        health = self.health()
        info, memory, counters = self._device_facts()
        runtimes = self.models.all()
        with engine.cond:
            published = {rt.generation for rt in engine.aliases.values()}
            models = tuple(self._model_view(rt, rt.generation in published) for rt in runtimes)
            now = time.monotonic()
            jobs = tuple(
                JobView(
                    s.job_id,
                    s.request.model,
                    s.generation,
                    s.state.name,
                    s.lane,
                    len(s.request.prompt_tokens),
                    len(s.generated),
                    s.request.priority,
                    now - s.t_submit,
                    s.request.client_request_id,
                )
                for s in engine.sequences.values()
            )
            c = engine.counters
            pool = self._pool_view(runtimes)
            return StatusView(
                board=self.config.board,
                driver=self.config.device,
                started_at=self.started_at,
                fault_injection=self.config.fault_injection,
                device=info,
                memory=memory,
                models=models,
                jobs=jobs,
                device_counters=counters,
                accepted=c.submitted,
                rejected=c.rejected,
                completed=c.completed,
                cancelled=c.cancelled,
                failed=c.failed,
                recoveries=c.recoveries,
                pool=pool,
                resets=c.resets,
                last_reset_reason=c.last_reset_reason,
                last_reset=c.last_reset,
                policy=self.config.policy,
                max_inflight=engine.executor.limit,
                inflight=len(engine.executor.inflight),
                draining=not engine.admitting,
                health=health,
                degraded_reason=engine.executor.degraded_reason,
                anomalies=engine.executor.anomalies,
            )

    def _device_facts(self) -> tuple[DeviceInfo, MemoryUsage, JobCounters]:
        """Device identity and counters; after a device loss, the last known identity and zeros."""
        try:
            facts = (self.device.info(), self.device.memory_usage(), self.device.counters())
        except DeviceLost:
            info = self._last_info
            return (
                DeviceInfo(info.name, info.board_index, info.chips, info.runtime_version, info.driver_version,
                           info.firmware_version, info.capabilities) if info else _LOST_INFO,
                MemoryUsage(),
                JobCounters(0, 0, 0, 0, 0),
            )  # fmt: skip
        self._last_info = facts[0]
        return facts

    def _model_view(self, rt: ModelRuntime, published: bool) -> ModelView:
        sched = self.engine.scheduler
        gen = rt.generation
        queues = QueueView(*sched.depths(gen, self.engine.sequences.values()))
        lanes = rt.kv.snapshot() if rt.kv is not None else ()
        return ModelView(
            rt.alias,
            gen,
            rt.state,
            published,
            rt.ready_at,
            rt.manifest.name,
            self.models.relative(rt.package_dir),
            lanes,
            queues,
            rt.message,
            self._package_hash_or_empty(rt),
        )

    def _package_hash(self, rt: ModelRuntime) -> str:
        """SHA-256 of the runtime's manifest, read once per generation (Status and GetModel share it).

        Raises:
            OSError: the manifest cannot be read.
        """
        key = (rt.alias, rt.generation)
        if key not in self._hashes:
            self._hashes[key] = hashlib.sha256((rt.package_dir / MANIFEST_NAME).read_bytes()).hexdigest()
        return self._hashes[key]

    def _package_hash_or_empty(self, rt: ModelRuntime) -> str:
        try:
            return self._package_hash(rt)
        except OSError:
            return ""  # Status still answers; GetModel reports the unreadable package

    @staticmethod
    def _pool_view(runtimes: list[ModelRuntime]) -> PoolView:
        in_use = free = quarantined = waits = 0
        for rt in runtimes:
            if rt.pool is None:
                continue
            st = rt.pool.stats()
            in_use += st.in_use
            quarantined += st.quarantined
            waits += st.acquire_misses
            free += sum(k.free for k in st.per_key.values())
        return PoolView(in_use, free, quarantined, waits)

    def load_report(self) -> LoadView:
        engine = self.engine
        health = self.health()
        with engine.cond:
            models = []
            for rt in engine.aliases.values():
                gen = rt.generation
                seqs = [s for s in engine.sequences.values() if s.generation == gen]
                waiting = sum(1 for s in seqs if s.state is SeqState.WAITING)
                models.append(
                    ModelLoadView(
                        rt.alias,
                        gen,
                        rt.state,
                        rt.state.serving,
                        waiting,
                        len(seqs) - waiting,
                        rt.kv.free_count() if rt.kv is not None else 0,
                        rt.kv.lanes if rt.kv is not None else 0,
                    )
                )
        return LoadView(f"board{self.config.board}", health.serving, health.draining, tuple(models))

    def get_model(self, alias: str) -> ModelInfoView:
        rt = self.models.serving(alias)
        if rt is None or rt.model is None:
            raise NotFound(f"unknown model {alias!r}")
        m = rt.manifest
        try:
            tokenizer = (rt.package_dir / m.tokenizer.path).read_bytes()
            template = (rt.package_dir / m.tokenizer.chat_template).read_text(encoding="utf-8")
            package_hash = self._package_hash(rt)
        except OSError as exc:
            raise Unavailable(f"model {alias!r}: cannot read tokenizer files: {exc.strerror}") from None
        limits = rt.limits
        return ModelInfoView(
            alias=alias,
            generation=rt.generation,
            state=rt.state,
            package_name=m.name,
            package_hash=package_hash,
            model_role=m.model_role,
            family=m.architecture.family,
            quantization=m.quantization,
            vocab_size=limits.vocab_size,
            context=limits.context,
            lanes=rt.model.lanes,
            eos_token_ids=m.tokenizer.eos_token_ids,
            bos_token_id=m.tokenizer.bos_token_id,
            pad_token_id=m.tokenizer.pad_token_id,
            model_max_length=min(m.tokenizer.model_max_length, limits.context),
            tokenizer_json=tokenizer,
            chat_template=template,
        )


__all__ = ["DaemonConfig", "DeviceCore", "LoadProgress", "SubmitResult"]
