"""`DeviceCore`: the daemon's domain API, one object per board, no transport (DEVELOPERS.md rule 1).

A thin facade: it opens the device through the driver registry and holds the `Engine` (client jobs,
scheduling, device jobs, generations; its own lock) and the `ModelManager` (load / unload / warm-up).
Each method answers one request of the three planes of docs/daemon.md "Access planes" by calling
them and building a view (`observe/views.py`) from an `EngineSnapshot`; it never touches the
engine's state directly.
The gRPC servicer converts protobuf to these calls and back, nothing more.

Thread-safe: methods may be called from any thread. Inference and observation calls take the engine
lock only for bookkeeping (no device call runs under it); long operations (load, unload, drain, reset)
block their caller, never the engine threads.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from calculet.common.errors import FailedPrecondition, InvalidArgument, NotFound, Unavailable
from calculet.daemon.core.audit import OPERATOR_DRAIN, BoardAudit, escalation_entry, operator_entry
from calculet.daemon.core.config import DaemonConfig
from calculet.daemon.core.engine import Engine
from calculet.daemon.core.engine_types import SubmitReceipt
from calculet.daemon.core.events import EventLog
from calculet.daemon.core.model_state import ModelState
from calculet.daemon.core.models import LoadProgress, ModelManager, ProgressFn
from calculet.daemon.core.observe.model_memory import model_memory
from calculet.daemon.core.observe.observer import FAULT_UNLOAD_LEAK
from calculet.daemon.core.observe.snapshot import EngineSnapshot, GenerationView
from calculet.daemon.core.observe.status import HealthView, LoadView, ModelChipMemoryView, ModelInfoView, StatusView
from calculet.daemon.core.observe.views import PackageIdentity, health_view, load_view, status_view
from calculet.daemon.core.request import CheckedRequest, GenerationRequest, ModelLimits
from calculet.daemon.core.resets.budget import BoardHalt, ResetReport
from calculet.daemon.core.resets.escalation_actions import BoardEscalations
from calculet.daemon.core.resets.escalation_watch import Escalation, EscalationKind
from calculet.daemon.core.resets.escalations import Escalator
from calculet.daemon.core.resets.operator import OperatorHooks, operator_reset
from calculet.daemon.core.runtime import ModelRuntime
from calculet.daemon.core.switch import SwitchSpec
from calculet.daemon.device.api import VirtualDevice
from calculet.daemon.device.errors import DeviceLost
from calculet.daemon.device.guard import GuardedDevice
from calculet.daemon.device.registry import load_driver
from calculet.daemon.device.types import DeviceCapabilities, DeviceInfo, JobCounters, MemoryUsage
from calculet.daemon.package.identity import calbin_sha256, compiler_of
from calculet.daemon.package.manifest import MANIFEST_NAME

log = logging.getLogger(__name__)

CLOSE_SETTLE_S = (
    2.0  # at close, unload or an interrupting drain: how long cut-off device jobs may take before they count as hung
)
_LOST_INFO = DeviceInfo("lost", 0, (), "", "", "", DeviceCapabilities(0, False, 0, False))


class DeviceCore:
    """One board: device, engine, models."""

    def __init__(self, config: DaemonConfig, device: VirtualDevice | None = None) -> None:
        self.config = config
        # Every driver, calsim or a vendor binding, is used through the guard: the invariants the
        # engine relies on (buffers, lanes, banks) are checked before each device call.
        self.device = GuardedDevice(device or load_driver(config.device).open(config.board, config.device_options))
        # The board's audit trail: resets, escalations, switches, drains and leaks, whoever causes them.
        self.audit = BoardAudit(journal=config.audit_journal)
        self.engine = Engine(self.device, config.engine_config(), self.audit)
        self.models = ModelManager(
            self.engine,
            self.device,
            config.models_root,
            drain_timeout_s=config.drain_timeout_s,
            end_hung_jobs=self.end_if_hung,
            unload_unverified=self._unload_unverified,
            min_residency_s=config.min_residency_s,
            audit=self.audit,
        )
        # What an operator reset needs beyond the engine: the model manager and the board's health.
        self._reset_hooks = OperatorHooks(
            loaded=lambda alias: self.models.published(alias) is not None,
            rewarm=self.models.rewarm,
            audit_point=self._audit_point,
            memory_back=self.models.memory_back,
        )
        # docs/sources.md 000 §14's escalations, acted on by their own thread (`resets/escalations.py`).
        exit_process = self._request_exit if config.unhealthy_exit else None
        actions = BoardEscalations(self.engine, self.models, self.device, self._reset_hooks, exit_process, self.audit)
        self._escalator = Escalator(actions)
        self.engine.set_escalation_handler(self._escalator.request)
        self.engine.add_health_listener(self._on_halt)
        self.exit_reason = ""  # set when the board asks to exit with EXIT_DEVICE_UNHEALTHY
        self._exit_listeners: list[Callable[[str], None]] = []
        self.started_at = time.time()
        self._last_info: DeviceInfo | None = self.device.info()
        self._closed = False
        self._close_lock = threading.Lock()  # guards `_closed`
        self._hashes: dict[tuple[str, int], str] = {}  # (alias, generation) -> manifest SHA-256 (GIL-atomic)
        # (alias, generation) -> (compiler identities, calbin SHA-256), as `_hashes`
        self._calbins: dict[tuple[str, int], tuple[tuple[tuple[str, str], ...], str]] = {}

    # ---- lifecycle --------------------------------------------------------------------------

    def start(self, progress: ProgressFn | None = None) -> None:
        """Start the engine and the escalations, and load the startup models (raises if one fails)."""
        self.engine.start()
        self._escalator.start()
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
        self.engine.clear_health_listeners()  # the transport is gone: nobody to tell any more
        self._escalator.stop(timeout=settle_s)  # a running one (a golden check) ends with the jobs
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

    def submit(self, req: GenerationRequest | CheckedRequest, *, seed_given: bool = True) -> SubmitReceipt:
        """Queue a request (see `Engine.submit`); `seed_given` False: the seed was drawn for it.

        Raises:
            As `Engine.submit`.
        """
        return self.engine.submit(req, seed_given=seed_given)

    def count_rejected(self) -> None:
        """Count a refused Submit in Status's `rejected` (the transport calls it for every refusal)."""
        self.engine.count_rejected()

    def serving_limits(self, alias: str) -> ModelLimits | None:
        """The limits a Submit to `alias` is checked against: those of its serving generation, or None
        when none serves (unknown, loading, unloaded: `submit` refuses it for that). O(1).
        """
        return self.engine.generations.serving_limits(alias)

    def largest_context(self) -> int:
        """The largest context of any model loaded here, in any state (0 with none). O(models)."""
        return max((rt.manifest.context for rt in self.models.all()), default=0)

    def default_max_tokens(self, alias: str) -> int:
        """The room left by a prompt is computed per request; this is the model's context."""
        rt = self.models.published(alias)
        return rt.limits.context if rt is not None and rt.model is not None else 1

    def event_log(self, job_id: str, *, for_wait: bool = True) -> EventLog:
        return self.engine.event_log(job_id, for_wait=for_wait)

    def job_generation(self, job_id: str) -> tuple[int, int]:
        """(model generation, recoveries) of a job; (0, 0) once it is forgotten."""
        return self.engine.job_generation(job_id) or (0, 0)

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
        switch: SwitchSpec | None = None,
    ) -> ModelRuntime:
        return self.models.load(
            alias, path, progress, replace=replace, lanes=lanes, drain_timeout_s=drain_timeout_s, switch=switch
        )

    def unload(self, alias: str, timeout_s: float | None = None) -> ModelRuntime:
        """Drain and release the alias's generation; the returned runtime counts drained/cut jobs."""
        return self.models.unload(alias, self.config.drain_timeout_s if timeout_s is None else timeout_s)

    def drain(self, timeout_s: float | None = None, interrupt: bool = False) -> tuple[bool, int, int]:
        """An operator's drain: stop admitting and wait for running work. Returns (drained, remaining,
        interrupted)."""
        self.stop_admitting(OPERATOR_DRAIN)
        return self.wait_drained(timeout_s, interrupt)

    def stop_admitting(self, reason: str = "") -> None:
        """Stop admitting (a drain, until `resume`). `reason`: who drains and why, for the audit trail
        (an operator's drain, a shutdown); "": not audited (a drain already recorded)."""
        if not reason:
            self.engine.stop_admitting()
            return
        before = self._audit_point()
        jobs = self.engine.stop_admitting()
        message = f"admission stopped with {jobs} jobs running"
        self.audit.record(operator_entry("drain", reason, before, self._audit_point(), message, jobs=jobs))

    def wait_drained(self, timeout_s: float | None = None, interrupt: bool = False) -> tuple[bool, int, int]:
        """Wait until no job is left; optionally cancel what remains after the timeout.

        Returns:
            (drained, remaining, interrupted): no job is left, the jobs still left when it returns
            (counted after an interruption, whose cut-off jobs end within a step or through the
            reset `end_if_hung` runs), and how many it interrupted.
        """
        timeout_s = self.config.drain_timeout_s if timeout_s is None else timeout_s
        remaining = self.engine.wait_drained(timeout_s)
        interrupted = 0
        if remaining and interrupt:
            before = self._audit_point()
            for rt in self.models.all():
                interrupted += self.engine.generations.cancel_generation(rt.generation, "board drained")
            self.end_if_hung(self.engine.wait_device_idle, "interrupting drain")
            remaining = self.engine.wait_drained(self.config.job_timeout_s)  # returns once they ended
            message = f"{interrupted} jobs still running after {timeout_s:g}s ended UNAVAILABLE (resume elsewhere)"
            after = self._audit_point()
            entry = operator_entry(
                "drain", "drain interrupted", before, after, message, jobs=interrupted, ended=interrupted
            )
            self.audit.record(entry)
        return remaining == 0, remaining, interrupted

    def end_if_hung(self, idle: Callable[[float], bool], what: str) -> None:
        """After `what` (an unload, an interrupting drain) cut jobs off: wait `CLOSE_SETTLE_S` (at
        most the job timeout) with `idle(timeout)`, and end a device job still in flight then with a
        CCU reset, audited with the reason, rather than waiting out the job timeout. Another reset
        in progress ends it anyway."""
        if idle(min(CLOSE_SETTLE_S, self.config.job_timeout_s)):
            return
        reason = f"{what}: a device job still ran {CLOSE_SETTLE_S:g}s after its jobs were cancelled"
        log.warning("%s: resetting the compute units", reason)
        try:
            report = self.operator_reset("ccu", reason)
        except FailedPrecondition as exc:
            log.warning("%s: %s", reason, exc)
            return
        if not report.ok:
            log.error("%s: %s", reason, report.message)

    def wait_escalations(self, timeout: float) -> bool:
        """Wait until no escalation waits or runs (tests). Returns whether none does."""
        return self._escalator.wait_idle(timeout)

    def on_exit_request(self, listener: Callable[[str], None]) -> None:
        """Call `listener(reason)` when the board asks its process to exit with
        `EXIT_DEVICE_UNHEALTHY` (the device stayed unhealthy after a reset). From any thread; it
        must not block."""
        self._exit_listeners.append(listener)

    def _request_exit(self, reason: str) -> None:
        self.exit_reason = reason
        for listener in self._exit_listeners:
            listener(reason)

    def _on_halt(self) -> None:
        """A health listener (engine lock held, must not block): a LOST board escalates."""
        if self.engine.resets.halt is BoardHalt.LOST:
            self._escalator.request(Escalation(EscalationKind.UNHEALTHY, "board lost: device unhealthy"))

    def resume(self) -> bool:
        """Admit again after a drain, audited when the board was not admitting. Returns whether it was
        not."""
        before = self._audit_point()
        was = self.engine.resume()
        if was:
            after = self._audit_point()
            message = "admitting again" if after[0] else "drain ended; the board still does not serve (halted)"
            self.audit.record(operator_entry("resume", "operator resume", before, after, message))
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
        """Operator reset, one at a time: "ccu" or "configuration" (a configuration reset may name
        `model`). The engine's reset controller runs it; the steps, the report and the errors are
        `resets.operator.operator_reset`'s.
        """
        return operator_reset(self.engine.resets, self._reset_hooks, kind, reason, model, settle_timeout_s)

    def _unload_unverified(self, rt: ModelRuntime, problem: str) -> None:
        """An unload did not give back its memory (or left the device unhealthy): stop serving and
        configure nothing until an operator reset finds the memory back, and audit why (docs/sources.md
        000 §10.3 step 5). Called under the model manager's device lock: it takes no lock of its."""
        reason = f"unload of {rt.alias} generation {rt.generation} ({rt.package_dir.name})"
        note = f"{reason} not verified: {problem}"
        before = self._audit_point()
        self.engine.resets.halt_for_operator(note)
        entry = escalation_entry("unload", reason, FAULT_UNLOAD_LEAK, 0, before, self._audit_point(), False, note)
        self.audit.record(entry)

    def _audit_point(self) -> tuple[bool, tuple[str, ...]]:
        """(serving, "alias@generation" of every serving model), for the reset audit trail."""
        return self.health().serving, self.engine.generations.serving_generations()

    def set_reset_budget(self, limit: int, window_s: float | None = None) -> None:
        """Change the automatic reset budget: `limit` resets per `window_s` seconds (None: unchanged)."""
        if limit < 0 or (window_s is not None and not window_s > 0):
            raise InvalidArgument(f"reset budget: limit >= 0 and a positive window, got {limit}/{window_s}")
        self.engine.resets.set_budget(limit, window_s)

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
        return health_view(self.engine.snapshot(), self.device.healthy())

    def on_health_change(self, listener: Callable[[], None]) -> None:
        """Call `listener()` (from an engine thread; it must not block) when the board stops
        serving on its own: device lost, automatic reset budget used up, a crashed device thread."""
        self.engine.add_health_listener(listener)

    def on_heartbeat(self, listener: Callable[[], None], interval_s: float) -> None:
        """Call `listener()` from the engine thread's loop at least every `interval_s` seconds (the
        systemd watchdog): a wedged engine thread stops calling it. It must not block."""
        self.engine.add_heartbeat_listener(listener, interval_s)

    def snapshot(self) -> EngineSnapshot:
        """The engine's state at one instant (tests and tools read counters from it)."""
        return self.engine.snapshot()

    def status(self) -> StatusView:
        device = self._device_facts()
        snap = self.engine.snapshot()
        health = health_view(snap, self.device.healthy())
        c = self.config
        identity = (c.board, c.device, self.started_at, c.fault_injection, c.policy)
        return status_view(
            snap=snap,
            health=health,
            identity=identity,
            device=device,
            describe=self._describe,
            memory_excess=self.models.memory_excess(),
            model_memory=self._model_memory,
        )

    def load_report(self) -> LoadView:
        snap = self.engine.snapshot()
        health = health_view(snap, self.device.healthy())
        return load_view(f"board{self.config.board}", snap, health, lambda g: self._describe(g).package_hash)

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

    def _describe(self, g: GenerationView) -> PackageIdentity:
        """A generation's package: path as operators name it, manifest hash ("" if unreadable),
        compiler identities and calbin hash (from its parsed manifest, once per generation)."""
        path = self.models.relative(g.package_dir)
        try:
            digest = self._manifest_hash(g.alias, g.generation, g.package_dir)
        except OSError:
            return PackageIdentity(path)  # Status still answers; GetModel reports the unreadable package
        key = (g.alias, g.generation)
        if key not in self._calbins:
            rt = next((r for r in self.models.all() if (r.alias, r.generation) == key), None)
            if rt is None:
                return PackageIdentity(path, digest)
            self._calbins[key] = (compiler_of(rt.manifest), calbin_sha256(rt.manifest))
        compiler, calbin = self._calbins[key]
        return PackageIdentity(path, digest, compiler, calbin)

    def _model_memory(self, g: GenerationView) -> tuple[ModelChipMemoryView, ...]:
        """A generation's memory per chip: planned for its configured KV layout (the manifest's
        before it is configured) beside what its configure took (`observe/model_memory.py`)."""
        rt = next((r for r in self.models.all() if (r.alias, r.generation) == (g.alias, g.generation)), None)
        if rt is None:
            return ()
        configured = rt.model
        if configured is None:
            return model_memory(rt.manifest, rt.manifest.kv.lanes, rt.manifest.kv.lane_context, None)
        taken = self.models.footprint(configured.config_id)
        return model_memory(rt.manifest, configured.lanes, configured.lane_context, taken)

    def _manifest_hash(self, alias: str, generation: int, package_dir: Path) -> str:
        """SHA-256 of a generation's manifest, read once per generation (Status and GetModel share it).

        Raises:
            OSError: the manifest cannot be read.
        """
        key = (alias, generation)
        if key not in self._hashes:
            self._hashes[key] = hashlib.sha256((package_dir / MANIFEST_NAME).read_bytes()).hexdigest()
        return self._hashes[key]

    def get_model(self, alias: str) -> ModelInfoView:
        rt = self.models.published(alias)
        if rt is None or rt.model is None:
            raise NotFound(f"unknown model {alias!r}")
        m = rt.manifest
        try:
            tokenizer = (rt.package_dir / m.tokenizer.path).read_bytes()
            template = (rt.package_dir / m.tokenizer.chat_template).read_text(encoding="utf-8")
            package_hash = self._manifest_hash(rt.alias, rt.generation, rt.package_dir)
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
            prefill_fixed_ms=m.timing.prefill_fixed_ms,
            prefill_ms_per_token=m.timing.prefill_ms_per_token,
            decode_step_ms=m.timing.decode_curve[0].ms_per_token,
            prefill_chunk_tokens=rt.prefill_chunk,
        )


__all__ = ["DaemonConfig", "DeviceCore", "LoadProgress", "SubmitReceipt"]
