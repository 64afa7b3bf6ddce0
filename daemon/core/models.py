"""Model lifecycle per alias: load, warm, publish, drain, unload (docs/daemon.md, docs/sources.md 000 §10).

`ModelManager` drives each generation through the table in `model_state.py`:
Validating (package validator, on the caller's thread, never the device threads) -> Configuring
(device.configure, host buffer pools) -> Warming (the package's golden prefill/decode through the
real engine path) -> Ready (the alias is switched to the new generation in one step). Where the
device can hold two configurations, a reload loads beside the old generation and then drains it;
where it cannot, the old generation is drained and unloaded first. A second Load of an alias that is
loading is refused. Unload drains with a timeout, then cancels what is left and waits for the
device to finish with every buffer before releasing the configuration.

The generations themselves live in the engine's one table (`GenerationTable`): this manager adds,
publishes, fences and removes them through the engine's methods and keeps no map of its own. Its
lock guards only the set of aliases being loaded. Load, unload and warm-up block their caller
(an operations RPC's worker thread), never the engine's threads.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from calculet.common.aliases import check_alias
from calculet.common.errors import (
    Aborted,
    CalculetError,
    ErrorKind,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
)
from calculet.common.phase_clock import PhaseClock
from calculet.daemon.core.audit import BoardAudit
from calculet.daemon.core.chunking import CHUNK_OFF
from calculet.daemon.core.client_job import ProbeShape
from calculet.daemon.core.engine import Engine
from calculet.daemon.core.engine_types import ProbeOutcome
from calculet.daemon.core.errors import BoardHalted
from calculet.daemon.core.golden import AttemptResult, GoldenVerdict, golden_request, judge
from calculet.daemon.core.golden import recheck as golden_recheck
from calculet.daemon.core.memory_ledger import MemoryLedger
from calculet.daemon.core.model_state import ModelState
from calculet.daemon.core.offset_probe import offset_request, prove_offset
from calculet.daemon.core.prefill_offset import (
    OffsetDecision,
    OffsetVerdict,
    OffsetWants,
    PrefillOffsetRefused,
    decide,
    undeclared_reason,
)
from calculet.daemon.core.runtime import ModelRuntime
from calculet.daemon.core.scheduler import SchedulingPolicy
from calculet.daemon.core.switch import SwitchSpec, phases_text, switch_entry
from calculet.daemon.core.unload_check import ChipExcess, Footprint, excess_text, footprint, unload_problem
from calculet.daemon.device.api import ConfiguredModel, VirtualDevice
from calculet.daemon.device.errors import DeviceError, ModelReleased, OutOfDeviceMemory
from calculet.daemon.package.capacity import DeviceLimits
from calculet.daemon.package.compat import co_residency_refusal, driver_refusal
from calculet.daemon.package.fs import is_symlink_loop
from calculet.daemon.package.manifest import PackageManifest
from calculet.daemon.package.validate import validate_package

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadProgress:
    """One step of a load, streamed to the operator.

    `bytes_done` / `bytes_total`: bytes of the package files processed in the current phase / in
    all, 0/0 when the phase has no byte measure. Only Validating has one (hashing every listed
    file, throttled by `package.byte_progress`); configure reads the files inside the device driver,
    which reports no bytes.
    """

    alias: str
    generation: int
    state: ModelState
    message: str
    done: bool = False
    error_kind: ErrorKind | None = None
    bytes_done: int = 0
    bytes_total: int = 0


ProgressFn = Callable[[LoadProgress], None]


class ModelManager:
    """Aliases, their generations and the operations that change them.

    Args:
        engine: the board's engine (runs warm-up probes and serves published generations).
        device: the opened board.
        models_root: every package path must resolve inside this directory.
        warm_timeout_s: how long the golden check may take.
        drain_timeout_s: default time a replaced generation may drain before its jobs are cut off.
        end_hung_jobs: `end_hung_jobs(idle, what)` after a generation's sequences were cut off:
            waits a little with `idle(timeout) -> bool` and, if a device job is still in flight (a
            healthy one ends within a step), ends it through a reset instead of waiting out the job
            timeout (`DeviceCore.end_if_hung`); `what` names the operation in the audit.
        unload_unverified: `unload_unverified(rt, problem)` when a release did not give back the
            memory `rt`'s configure took, or left the device unhealthy: it halts the board, which
            then configures nothing until a reset proves the memory back. Called under the device
            lock, so no configure lands between the release and the halt.
        min_residency_s: a switch does not replace a generation Ready for less than this, unforced.
        audit: the board's audit trail, where each switch is recorded (None: the engine's).
    """

    def __init__(
        self,
        engine: Engine,
        device: VirtualDevice,
        models_root: Path,
        warm_timeout_s: float = 120.0,
        drain_timeout_s: float = 30.0,
        end_hung_jobs: Callable[[Callable[[float], bool], str], None] | None = None,
        unload_unverified: Callable[[ModelRuntime, str], None] | None = None,
        min_residency_s: float = 0.0,
        audit: BoardAudit | None = None,
    ):
        self.engine = engine
        self._audit = engine.audit if audit is None else audit
        self.min_residency_s = min_residency_s
        self._unload_unverified = unload_unverified
        # Configure and release one at a time, with the memory usage read around each: a model's
        # footprint is what its configure took, and its release must give it back (`unload_check`).
        self._device_lock = threading.Lock()
        self._end_hung_jobs = end_hung_jobs
        self.device = device
        self.models_root = models_root.resolve()
        self.warm_timeout_s = warm_timeout_s
        self.drain_timeout_s = drain_timeout_s
        self._lock = threading.Lock()  # guards `_loading` only
        self._loading: set[str] = set()
        # alias -> (package, lanes) it served before a replacing load took over: what a failed
        # re-check after a quarantine rolls back to (only the last one; set and read by load/recheck).
        self._previous: dict[str, tuple[Path, int]] = {}
        self._generations = itertools.count(1)
        self._ledger = MemoryLedger(device.memory_usage())  # the baseline: nothing configured yet
        info = device.info()
        self.max_resident = info.capabilities.max_resident_configurations
        self.limits = DeviceLimits.from_device_info(info)

    # ---- queries --------------------------------------------------------------------------

    def memory_excess(self) -> tuple[ChipExcess, ...]:
        """What each chip held above its baseline when last measured (at each configure, release and
        reset), for Status and the metrics."""
        return self._ledger.excess

    def footprint(self, config_id: int) -> Footprint | None:
        """The device memory a configuration took, per chip, as measured around its configure (None:
        unknown here), for Status beside the planner's figure."""
        return self._ledger.footprint(config_id)

    def published(self, alias: str) -> ModelRuntime | None:
        """The generation published under `alias` (in any state), or None."""
        return self.engine.generations.published(alias)

    def all(self) -> list[ModelRuntime]:
        """Every generation not yet unloaded, oldest first."""
        return self.engine.generations.generation_list()

    def resolve_package(self, path: str) -> Path:
        """Confine a package path to the models root.

        Raises:
            InvalidArgument: empty path.
            PermissionDenied: the path resolves outside the models root.
            NotFound: no such directory.
        """
        if not path:
            raise InvalidArgument("package path: must not be empty")
        try:
            lexical = self.models_root / path
            if is_symlink_loop(lexical) and Path(os.path.normpath(lexical)).is_relative_to(self.models_root):
                return lexical  # unreadable, hence harmless: the validator reports file.symlink_loop
            candidate = lexical.resolve()
            if not candidate.is_relative_to(self.models_root):
                raise PermissionDenied(f"package path {path!r} is outside the models root {self.models_root}")
            if not candidate.is_dir():
                raise NotFound(f"package {path!r} not found under the models root")
        except (OSError, ValueError, RuntimeError) as exc:  # NUL bytes, names too long, loops
            raise InvalidArgument(f"package path {path[:200]!r}: {exc}") from None
        return candidate

    # ---- load -----------------------------------------------------------------------------

    def relative(self, package_dir: Path) -> str:
        """A package directory as operators name it: relative to the models root."""
        return (
            str(package_dir.relative_to(self.models_root))
            if package_dir.is_relative_to(self.models_root)
            else str(package_dir)
        )

    def load(
        self,
        alias: str,
        path: str,
        progress: ProgressFn | None = None,
        *,
        replace: bool = False,
        lanes: int | None = None,
        drain_timeout_s: float | None = None,
        switch: SwitchSpec | None = None,
    ) -> ModelRuntime:
        """Load a package under `alias` and publish it when Ready.

        Args:
            replace: the alias may already serve; the new generation takes over when Ready.
            lanes: configure fewer KV lanes than the package declares (None = all of them).
            drain_timeout_s: how long a replaced generation may drain (None = the daemon default).
            switch: replace exactly this generation (of this or another alias): validate the new
                package, then drain, unload and verify the old one, then configure, warm and publish
                (`_switch`); audited with each phase's seconds.

        Returns:
            The Ready runtime.

        Raises:
            InvalidArgument: bad alias, or lanes outside 1..the package's lanes.
            PermissionDenied / NotFound: bad path.
            FailedPrecondition: the alias is already loading, or already serving without `replace`,
                the package is invalid, it cannot be configured next to what is loaded, or its golden
                check failed; a switch's target has been Ready for less than the minimum residency.
            Aborted: the board does not serve the generation a switch expects (another one won).
            BoardHalted: the board is halted (nothing was done), or it halted while a switch or a
                replacing load unloaded the old generation (an unload that did not give its memory
                back): the new package is not configured and the old one not loaded back.
        """
        check_alias(alias)
        package_dir = self.resolve_package(path)
        self._refuse_if_halted()  # before anything changes: nothing would run its warm-up anyway
        old = self._switch_target(alias, switch) if switch is not None else None
        if not replace and old is None and self.published(alias) is not None:
            raise FailedPrecondition(f"model {alias!r} is already loaded (use replace to reload it)")
        with self._lock:
            if alias in self._loading:
                raise FailedPrecondition(f"model {alias!r} is already loading")
            self._loading.add(alias)
        send = progress or (lambda _p: None)
        last: list[LoadProgress] = []

        def report(p: LoadProgress) -> None:
            # The last (done) progress waits until the alias is free again: a client that loads the
            # alias again as soon as it reads it must not be told "already loading".
            (last.append if p.done else send)(p)

        try:
            drain = self.drain_timeout_s if drain_timeout_s is None else drain_timeout_s
            if switch is not None and old is not None:
                return self._switch(alias, package_dir, report, lanes, drain, switch, old)
            return self._load(alias, package_dir, report, lanes, drain)
        finally:
            with self._lock:
                self._loading.discard(alias)
            for p in last:
                send(p)

    def _load(
        self,
        alias: str,
        package_dir: Path,
        progress: ProgressFn,
        lanes: int | None,
        drain_s: float,
        make_way: Callable[[], None] | None = None,
    ) -> ModelRuntime:
        """Validate, then (`make_way`, a switch's drain and unload of the generation it replaces)
        configure, warm and publish."""
        generation = next(self._generations)
        manifest, warnings, hashed = self._validate(alias, generation, package_dir, progress)
        if lanes is not None:
            if not 1 <= lanes <= manifest.kv.lanes:
                raise InvalidArgument(f"lanes: must be 1..{manifest.kv.lanes} for package {manifest.name}, got {lanes}")
            manifest = dataclasses.replace(manifest, kv=dataclasses.replace(manifest.kv, lanes=lanes))
        rt = ModelRuntime(alias, generation, manifest, package_dir)
        step = _Stepper(rt, progress)
        step.move(ModelState.VALIDATING, f"validated {package_dir.name} ({warnings} warnings)", bytes_total=hashed)
        wants = _offset_wants(self.engine.config.policy)
        try:  # an undeclared offset the settings force on is refused before anything changes
            undeclared = undeclared_reason(manifest)
            gate = decide(OffsetVerdict.UNDECLARED, undeclared, wants) if undeclared is not None else None
        except PrefillOffsetRefused as exc:
            step.fail(exc)
            raise PrefillOffsetRefused(f"load of {alias!r} failed: {exc}") from exc
        if make_way is not None:
            try:
                make_way()
                self._refuse_if_halted()  # the unload it made left memory behind: configure nothing
            except CalculetError as exc:
                step.fail(exc)
                raise
        self.engine.generations.add_generation(rt)
        try:
            step.move(ModelState.CONFIGURING, "configuring on the device")
            self._make_room(alias, manifest, drain_s)
            model = self._configure(alias, package_dir, manifest, drain_s)
            config = self.engine.config
            chunk = CHUNK_OFF if gate is not None else config.policy.prefill_chunk
            reuse = gate is None and config.policy.prefix_reuse
            rt.attach(self.device, model, self.engine.engine_slots, config.synchronous, chunk, reuse)
            step.move(ModelState.WARMING, f"{_cost_text(model)}; running the golden prefill/decode check")
            self.engine.generations.start_jobs(rt)
            # The golden prompt whole (one prefill job, whatever the chunk), its lane parked for the
            # offset check's continued run where the package declares the offset.
            whole_run = ProbeShape(chunk=len(manifest.golden.prompt_tokens), park=gate is None)
            whole = self._golden_check(rt, whole_run)
            self._settle_offset(rt, gate, wants, whole)
        except CalculetError as exc:
            step.fail(exc)
            self.engine.generations.cancel_generation(generation, f"load of {alias} failed")
            self.engine.generations.wait_generation_idle(generation, self.engine.config.job_timeout_s * 2)
            self._discard(rt)
            if isinstance(exc, BoardHalted):  # refused, not failed: the caller retries elsewhere
                raise BoardHalted(f"load of {alias!r} stopped: {exc}") from exc
            failed = PrefillOffsetRefused if isinstance(exc, PrefillOffsetRefused) else FailedPrecondition
            raise failed(f"load of {alias!r} failed: {exc}") from exc
        held = excess_text(self._ledger.excess)
        offset = rt.offset
        off = f"; {offset.summary()}" if offset is not None and not offset.allowed else ""
        step.move(ModelState.READY, f"generation {generation} serving{off}" + (f"; {held}" if held else ""), done=False)
        rt.ready_at = time.time()
        old = self.engine.generations.publish(rt)
        if old is not None:
            self._previous[alias] = (old.package_dir, old.manifest.kv.lanes)  # a quarantine's rollback
            self.retire(old, timeout=drain_s)
        progress(LoadProgress(alias, generation, ModelState.READY, "ready", True))
        return rt

    def _validate(
        self, alias: str, generation: int, package_dir: Path, progress: ProgressFn
    ) -> tuple[PackageManifest, int, int]:
        """Run the package validator (on this thread), streaming the bytes it hashes as Validating
        progress.

        Returns:
            The manifest, the number of warnings, and the bytes hashed (0: none).

        Raises:
            FailedPrecondition: the package is invalid (reported as the FAILED progress first).
        """
        hashed = 0

        def on_bytes(done: int, total: int) -> None:
            nonlocal hashed
            hashed = total
            message = f"hashing the files of {package_dir.name}"
            progress(
                LoadProgress(alias, generation, ModelState.VALIDATING, message, bytes_done=done, bytes_total=total)
            )

        report = validate_package(package_dir, self.limits, on_bytes=on_bytes)
        if report.manifest is None or not report.ok:
            problems = report.headline() or "manifest unreadable"  # codes, bounded in size
            progress(LoadProgress(alias, generation, ModelState.FAILED, problems, True, ErrorKind.FAILED_PRECONDITION))
            raise FailedPrecondition(f"package {package_dir.name} is invalid: {problems}")
        for w in report.warnings:  # loadable, but an operator should know (a vendor mislabel, a clamp)
            log.warning("package %s: %s at %s: %s", package_dir.name, w.code, w.where, w.message)
        return report.manifest, len(report.warnings), hashed

    def _configure(self, alias: str, package_dir: Path, manifest: PackageManifest, drain_s: float) -> ConfiguredModel:
        """Configure the package; if the device lacks memory for it beside the alias's serving
        generation (a large model on a two-model board), drain and unload that generation first.

        Raises:
            DeviceError: the device refused the package.
        """
        try:
            return self._configure_measured(package_dir, manifest)
        except OutOfDeviceMemory:
            old = self.published(alias)
            if old is None or not old.state.serving:
                raise
            log.info("no device memory for %s beside generation %d: draining it first", alias, old.generation)
            self.retire(old, timeout=drain_s)
            return self._configure_measured(package_dir, manifest)

    def _configure_measured(self, package_dir: Path, manifest: PackageManifest) -> ConfiguredModel:
        """`device.configure`, noting the memory it took in the ledger (by config id) and what the
        device holds above its baseline then (a warning in Status when it does).

        Raises:
            BoardHalted: the board is halted (checked under the device lock, which an unload that
                leaves memory behind holds until it has halted the board).
            DeviceError: the device refused the package.
        """
        with self._device_lock:
            self._refuse_if_halted()
            before = self.device.memory_usage()
            model = self.device.configure(package_dir, manifest)
            after = self.device.memory_usage()
            self._ledger.configured(model.config_id, footprint(before, after))
            held = excess_text(self._ledger.measure(after))
        if held:
            log.warning("configured %s on a device holding memory no model accounts for: %s", manifest.name, held)
        return model

    def _release_verified(self, rt: ModelRuntime, model: ConfiguredModel) -> None:
        """Release `model`, then check that the memory its configure took is free and the device is
        healthy; if not, tell `unload_unverified` (before any other configure may run). A
        configuration reset that already dropped the model (ModelReleased) leaves nothing to check."""
        with self._device_lock:
            taken = self._ledger.released(model.config_id)
            before = self.device.memory_usage()
            try:
                self.device.release(model)
            except ModelReleased:
                return
            after = self.device.memory_usage()
            self._ledger.measure(after)
            problem = unload_problem(taken, before, after, self.device.healthy())
            if problem is not None:
                log.error("unload of %s generation %d not verified: %s", rt.alias, rt.generation, problem)
                if self._unload_unverified is not None:
                    self._unload_unverified(rt, problem)

    def _refuse_if_halted(self) -> None:
        """Raises:
        BoardHalted: the board is halted: it configures nothing until an operator reset lifts the
            halt, which needs the device's memory back at its baseline (docs/daemon.md)."""
        refusal = self.engine.resets.refusal()
        if refusal is not None:
            raise refusal

    def memory_back(self, configuration: bool) -> str | None:
        """After a reset: re-measure the device's memory against its baseline.

        Args:
            configuration: the reset dropped every configuration, with the memory each took.

        Returns:
            What the chips hold above their baseline; None when the memory is back.
        """
        with self._device_lock:
            if configuration:
                self._ledger.dropped_all()
            try:
                usage = self.device.memory_usage()
            except DeviceError as exc:
                return f"it cannot be read ({exc})"
            return excess_text(self._ledger.measure(usage)) or None

    def _make_room(self, alias: str, manifest: PackageManifest, drain_s: float) -> None:
        """Where `manifest` may not be configured beside what the device holds (CalRT 0.7.6 holds one
        calbin; two need driver 1.0.0 and both packages' compatibility matrices), drain and unload the
        alias's old generation first; refuse when that would not be enough.

        Raises:
            FailedPrecondition: another alias's calbin stands in the way (it names the reason).
        """
        configured = [r for r in self.all() if r.model is not None]
        refusal = self._sharing_refusal(manifest, configured)
        if refusal is None:
            return
        old = self.published(alias)
        rest = [r for r in configured if r is not old]
        if old is None or old not in configured or self._sharing_refusal(manifest, rest) is not None:
            names = ", ".join(f"{r.alias}@{r.generation}" for r in rest or configured)
            raise FailedPrecondition(f"cannot configure {manifest.name} beside {names}: {refusal}; unload one first")
        self.retire(old, timeout=drain_s)

    def _sharing_refusal(self, manifest: PackageManifest, configured: list[ModelRuntime]) -> str | None:
        """Why `manifest` may not join `configured` on the device; None if it may (or nothing is there)."""
        if not configured:
            return None
        if len(configured) >= self.max_resident:
            driver = driver_refusal(self.limits)
            return f"device holds {len(configured)} configured models (its maximum)" + (f": {driver}" if driver else "")
        for m in (manifest, *(r.manifest for r in configured)):
            reason = co_residency_refusal(m, self.limits)
            if reason is not None:
                return reason
        return None

    def _golden_check(self, rt: ModelRuntime, shape: ProbeShape | None = None) -> ProbeOutcome:
        """Run the package's golden prefill/decode on `rt` and compare (`golden.judge`; a fault the
        probe re-prefilled past does not fail it). `shape`: the offset check's (its lane parked).

        Returns:
            The matching run.

        Raises:
            FailedPrecondition: it did not finish, or did not match.
        """
        probe = self.engine.probe(golden_request(rt.alias, rt.manifest.golden), rt, self.warm_timeout_s, shape)
        attempt = judge(probe, rt.manifest.golden, self.warm_timeout_s)
        if probe is None or attempt.result is not AttemptResult.MATCH:
            raise FailedPrecondition(attempt.message)
        return probe

    def _settle_offset(
        self, rt: ModelRuntime, gate: OffsetDecision | None, wants: OffsetWants, whole: ProbeOutcome
    ) -> None:
        """Decide whether the warming generation prefills at an offset (`prefill_offset.py`): `gate`
        when its package does not declare it, else what the offset check (`offset_probe.py`) proves
        after the golden check's `whole` run. Logs it; Status and the metrics show `rt.offset`.

        Raises:
            PrefillOffsetRefused: not proven, and the settings force chunking or reuse on.
            CalculetError: the board refused a probe.
        """
        decision = gate
        if decision is None:
            golden = rt.manifest.golden
            timeout = self.warm_timeout_s

            def run(shape: ProbeShape, tokens: int) -> ProbeOutcome | None:
                return self.engine.probe(offset_request(rt.alias, golden, tokens), rt, timeout, shape)

            verdict, reason = prove_offset(run, whole, len(golden.prompt_tokens))
            decision = decide(verdict, reason, wants)
        self.engine.generations.settle_offset(rt, decision)
        what = f"model {rt.alias} generation {rt.generation}"
        if decision.allowed:
            log.info("%s: %s", what, decision.summary())
        else:
            log.warning("%s: %s", what, decision.summary())

    # ---- switches ------------------------------------------------------------------------------

    def _switch_target(self, alias: str, spec: SwitchSpec) -> ModelRuntime:
        """The generation `spec` expects, checked before anything changes.

        Raises:
            Aborted: the board does not serve exactly `spec.alias` at `spec.generation`.
            FailedPrecondition: `alias` already serves under its own name (and is not the target),
                or the target has been Ready for less than the minimum residency without `force`.
        """
        check_alias(spec.alias)
        old = self.published(spec.alias)
        if old is None or old.generation != spec.generation or not old.state.serving:
            now = f"{spec.alias}@{old.generation} ({old.state.value})" if old is not None else f"no {spec.alias}"
            raise Aborted(f"switch expected {spec.target} but the board serves {now}: another switch or load won")
        if alias != spec.alias and self.published(alias) is not None:
            raise FailedPrecondition(
                f"model {alias!r} is already loaded; a switch replaces {spec.target} with a new alias"
            )
        age = time.time() - (old.ready_at or 0.0)
        if not spec.force and age < self.min_residency_s:
            raise FailedPrecondition(
                f"{spec.target} has been ready {age:.0f} s, less than the minimum residency "
                f"{self.min_residency_s:g} s: switch later, or force it"
            )
        return old

    def _switch(
        self,
        alias: str,
        package_dir: Path,
        progress: ProgressFn,
        lanes: int | None,
        drain_s: float,
        spec: SwitchSpec,
        old: ModelRuntime,
    ) -> ModelRuntime:
        """Replace `old` with a new generation of `package_dir`, phase by phase, then audit it. A
        load that fails once `old` is gone loads `old`'s package back."""
        clock = PhaseClock(old.generation)
        before = self.engine.generations.serving_generations()

        def observe(p: LoadProgress) -> None:
            clock.seen(p.generation, p.state)
            progress(p)

        retired: list[bool] = []

        def make_way() -> None:
            if not self.retire(old, drain_s, observe):
                raise Aborted(f"switch expected {spec.target} but another switch or unload is retiring it")
            retired.append(True)

        new = f"{alias} ({package_dir.name})"
        try:
            rt = self._load(alias, package_dir, observe, lanes, drain_s, make_way)
        except CalculetError as exc:
            if not retired:  # refused before it changed anything (invalid package, lost the race)
                raise
            message = f"failed: {exc}; {phases_text(clock.seconds())}"
            if old.state is ModelState.UNLOADED:
                message += f"; {self._switch_back(old, alias, drain_s)}"
            jobs = (old.drained_jobs, old.interrupted_jobs)
            after = self.engine.generations.serving_generations()
            self._audit.record(switch_entry(spec, new, before, after, jobs, False, message))
            raise
        message = f"{spec.target} -> {alias}@{rt.generation}: {phases_text(clock.seconds())}"
        if rt.model is not None:
            message += f" ({_cost_text(rt.model)} on the device)"
        jobs = (old.drained_jobs, old.interrupted_jobs)
        after = self.engine.generations.serving_generations()
        self._audit.record(switch_entry(spec, f"{alias}@{rt.generation}", before, after, jobs, True, message))
        return rt

    def _switch_back(self, old: ModelRuntime, alias: str, drain_s: float) -> str:
        """After a failed switch unloaded `old`: load its package again, unless the board halted
        (the unload left memory behind: nothing is configured). Returns what happened."""
        path, lanes = self.relative(old.package_dir), old.manifest.kv.lanes
        refusal = self.engine.resets.refusal()
        if refusal is not None:
            return f"{path} not loaded back as {old.alias}: {refusal}"
        try:
            if old.alias == alias:  # this load holds the alias: load it again directly
                rt = self._load(old.alias, old.package_dir, lambda _p: None, lanes, drain_s)
            else:
                rt = self.load(old.alias, path, lanes=lanes)
        except CalculetError as exc:
            return f"loading {path} back as {old.alias} failed: {exc}"
        return f"{path} loaded back as {old.alias}@{rt.generation}"

    # ---- after a configuration reset --------------------------------------------------------

    def rewarm(self, rt: ModelRuntime) -> CalculetError | None:
        """A configuration reset dropped this Ready generation's calbin (it is Configuring now):
        configure its package again, replay the golden check, and serve again (Ready). Its clients'
        jobs re-prefill into rebuilt lanes once it is Ready.

        Returns:
            None when it serves again; else why it failed: it is then Failed, its jobs end with
            UNAVAILABLE (a gateway resumes them elsewhere), its alias is unpublished and its buffers
            are released.
        """
        if rt.model is not None:
            self._ledger.released(rt.model.config_id)  # the reset dropped it with its memory
        try:
            self.engine.generations.replace_model(rt, self._configure_measured(rt.package_dir, rt.manifest))
            self._golden_check(rt)
        except CalculetError as exc:
            self._fail_generation(rt, "after a configuration reset", exc)
            return exc
        rt.message = "configured and warmed again after a configuration reset"
        self.engine.generations.move_generation(rt, ModelState.READY)
        return None

    # ---- after repeated non-finite outputs --------------------------------------------------

    def recheck(self, rt: ModelRuntime, reason: str) -> RecheckOutcome | None:
        """Quarantine a Ready generation (its running jobs end UNAVAILABLE, to resume elsewhere) and
        re-check its golden output (`golden.recheck`: a run a device fault disturbed runs again; a
        wrong output, or NaN/Inf logits each time a step ran, counts only when a second run
        reproduces it). Passed or inconclusive (no reproduced mismatch): Ready again. Failed: the
        generation is Failed and unloaded, and the alias rolls back to the package it served before
        (recorded when a replacing load took over), or stays unloaded without one.

        Returns:
            What happened; None when the generation was not Ready (nothing done).
        """
        if not self.engine.generations.quarantine_generation(rt, reason):
            return None
        golden = rt.manifest.golden
        try:
            result = golden_recheck(
                lambda timeout: self.engine.probe(golden_request(rt.alias, golden), rt, timeout),
                golden,
                self.warm_timeout_s,
                f"{rt.alias}@{rt.generation}",
            )
        except CalculetError as exc:  # the probe was refused, not for the board's state: it cannot be checked
            self._fail_generation(rt, "after its quarantine", exc)
            return self._roll_back(rt, f"golden check failed: {exc}")
        finally:
            self.engine.forget_escalations(rt.generation)
        summary = result.summary()
        if result.verdict is GoldenVerdict.FAILED:
            self._fail_generation(rt, "after its quarantine", FailedPrecondition(summary))
            return self._roll_back(rt, summary)
        # Passed, or inconclusive: a device fault is no evidence that the model is wrong (docs/daemon.md).
        rt.message = f"{summary} after a quarantine"
        self.engine.generations.move_generation(rt, ModelState.READY)
        return RecheckOutcome(result.verdict, True, f"generation {rt.generation}: {summary}, serving again")

    def _roll_back(self, failed: ModelRuntime, why: str) -> RecheckOutcome:
        """Load the package the alias served before `failed` (now unloaded), if one was recorded."""
        previous = self._previous.pop(failed.alias, None)
        if previous is None:
            return RecheckOutcome(
                GoldenVerdict.FAILED, False, f"{why}; generation {failed.generation} unloaded, no earlier package"
            )
        path, lanes = self.relative(previous[0]), previous[1]
        try:
            rt = self.load(failed.alias, path, lanes=lanes)
        except CalculetError as exc:
            return RecheckOutcome(GoldenVerdict.FAILED, False, f"{why}; rollback to {path} failed: {exc}")
        return RecheckOutcome(GoldenVerdict.FAILED, True, f"{why}; rolled back to {path} (generation {rt.generation})")

    def _fail_generation(self, rt: ModelRuntime, when: str, exc: CalculetError) -> None:
        """A published generation failed its golden check `when`: Failed, its jobs end UNAVAILABLE (a
        gateway resumes them elsewhere), its alias unpublished, its buffers released, Unloaded."""
        log.error("model %s generation %d failed %s: %s", rt.alias, rt.generation, when, exc)
        rt.message = f"failed {when}: {exc}"
        self.engine.generations.move_generation(rt, ModelState.FAILED)
        self.engine.generations.cancel_generation(rt.generation, f"model {rt.alias} failed {when}")
        self.engine.generations.wait_generation_idle(rt.generation, self.engine.config.job_timeout_s * 2)
        self.engine.generations.unpublish(rt.alias, rt.generation)
        self._discard(rt)
        rt.lifecycle.move(ModelState.UNLOADED)

    # ---- unload ---------------------------------------------------------------------------

    def unload(self, alias: str, timeout: float) -> ModelRuntime:
        """Drain the alias's serving generation, then release it. Returns the retired generation
        (its `drained_jobs` / `interrupted_jobs` say how the drain went).

        Raises:
            NotFound: the alias is not loaded.
            FailedPrecondition: another Unload (or a replacing Load) is already retiring it.
        """
        rt = self.published(alias)
        if rt is None:
            raise NotFound(f"model {alias!r} is not loaded")
        if not self.retire(rt, timeout):
            raise FailedPrecondition(f"model {alias!r} generation {rt.generation} is already being unloaded")
        return rt

    def retire(self, rt: ModelRuntime, timeout: float, progress: ProgressFn | None = None) -> bool:
        """Ready -> Draining -> Unloading -> Unloaded: finish or cancel its work, then release.

        While it drains, the alias (unless a newer generation took it over) answers UNAVAILABLE.
        `progress` hears each of the three states (a switch's stream).

        Returns:
            False, doing nothing, when the generation is no longer Ready: another caller (an Unload,
            or a Load replacing it) is already retiring it and finishes the job.
        """
        if not self.engine.generations.begin_draining(rt):
            return False
        tell = progress or (lambda _p: None)
        running = self.engine.generations.count_sequences(rt.generation)
        tell(
            LoadProgress(
                rt.alias, rt.generation, ModelState.DRAINING, f"{rt.alias}@{rt.generation}: draining {running} job(s)"
            )
        )
        if self.engine.generations.wait_generation_idle(rt.generation, timeout):
            rt.drained_jobs = running
        else:
            cancelled = self.engine.generations.cancel_generation(rt.generation, f"model {rt.alias} unloaded")
            rt.interrupted_jobs, rt.drained_jobs = cancelled, max(0, running - cancelled)
            log.warning("unload %s gen %s: cancelled %d jobs after %.1fs", rt.alias, rt.generation, cancelled, timeout)
            # Cancel only stops delivery; the device still owns in-flight buffers until it is done.
            self._wait_device_jobs(rt)
        self.engine.generations.unpublish(rt.alias, rt.generation)
        rt.lifecycle.move(ModelState.UNLOADING)
        tell(LoadProgress(rt.alias, rt.generation, ModelState.UNLOADING, f"{rt.alias}@{rt.generation}: unloading"))
        self._discard(rt)
        rt.lifecycle.move(ModelState.UNLOADED)
        done = f"{rt.drained_jobs} job(s) drained, {rt.interrupted_jobs} interrupted, memory verified"
        tell(
            LoadProgress(rt.alias, rt.generation, ModelState.UNLOADED, f"{rt.alias}@{rt.generation}: unloaded ({done})")
        )
        return True

    def _wait_device_jobs(self, rt: ModelRuntime) -> None:
        """Wait for a cancelled generation's device jobs to end; a hung one is ended through
        `end_hung_jobs` (a CCU reset) rather than the job timeout."""
        if self._end_hung_jobs is not None:
            idle = functools.partial(self.engine.generations.wait_generation_idle, rt.generation)
            self._end_hung_jobs(idle, f"unload of {rt.alias} generation {rt.generation}")
        self.engine.generations.wait_generation_idle(rt.generation, self.engine.config.job_timeout_s * 2)

    def _discard(self, rt: ModelRuntime) -> None:
        """Fence a generation, give its device resources back, and remove it from the engine."""
        self.engine.generations.fence_generation(rt.generation)
        if rt.pool is not None:
            rt.pool.close()
        if rt.model is not None:
            self._release_verified(rt, rt.model)
            rt.model = None
        self.engine.generations.remove_generation(rt.generation)


@dataclass(frozen=True)
class RecheckOutcome:
    """How a quarantine's golden re-check ended.

    Attributes:
        verdict: passed, failed (a reproduced mismatch) or inconclusive (device faults only).
        serving: the alias serves (passed or inconclusive: the generation serves again; failed:
            rolled back to its earlier package).
        message: what happened, for the audit.
    """

    verdict: GoldenVerdict
    serving: bool
    message: str

    @property
    def passed(self) -> bool:
        """The generation passed its re-check and serves again."""
        return self.verdict is GoldenVerdict.PASSED


class _Stepper:
    """Moves a runtime through its lifecycle and reports each step."""

    def __init__(self, rt: ModelRuntime, progress: ProgressFn) -> None:
        self.rt = rt
        self.progress = progress

    def move(self, state: ModelState, message: str, done: bool = False, bytes_total: int = 0) -> None:
        """Enter `state`; `bytes_total` > 0: the phase's byte measure, reported complete."""
        self.rt.lifecycle.move(state)
        self.rt.message = message
        rt = self.rt
        self.progress(LoadProgress(rt.alias, rt.generation, state, message, done, None, bytes_total, bytes_total))

    def fail(self, exc: CalculetError) -> None:
        self.rt.lifecycle.move(ModelState.FAILED)
        self.rt.message = str(exc)
        self.progress(LoadProgress(self.rt.alias, self.rt.generation, ModelState.FAILED, str(exc), True, exc.kind))
        self.rt.lifecycle.move(ModelState.UNLOADED)


def _offset_wants(policy: SchedulingPolicy) -> OffsetWants:
    """What the daemon's settings ask of the features that prefill at an offset (`prefill_offset.py`)."""
    return OffsetWants(
        chunk=policy.prefill_chunk != CHUNK_OFF,
        reuse=policy.prefix_reuse,
        chunk_forced=policy.prefill_chunk_forced,
        reuse_forced=policy.prefix_reuse_forced,
    )


def _cost_text(model: ConfiguredModel) -> str:
    """`configured in 2.80 s (configure 0.20, upload 2.27, ...)`, or `configured` when the device says nothing."""
    cost = model.configure_cost
    if not cost:
        return "configured"
    phases = ", ".join(f"{name} {seconds:.2f}" for name, seconds in cost.items())
    return f"configured in {sum(cost.values()):.2f} s ({phases})"
