"""One soak run from start to verdict: `SoakRun(settings).run()` (the command is a thin front).

1. Packages (`fleets.prepare_packages`: the preset and its copy; the second model's with
   `--models A,B`), the pool (`mix.build_pool`, texts sized with the package's tokenizer), the
   references (`references.ReferenceBook`: the reference fleet starts only if the cache lacks
   answers, and stops before the soak; the second model's burst has a book and a fleet of its own).
2. The soak fleet (`LocalFleet`), then its capacity (`capacity`: a calibration closed loop, with
   the timing-model limit beside it at time scale > 0) and the arrival rate.
3. The soak phase, `duration` of board time long (`SoakSettings.phase_s` wall seconds on the
   `Timeline`): `TrafficRunner.run_open`, with the `Supervisor`, the `UsageSampler`, `Chaos` and
   a progress line as tasks beside it. When the arrivals end: no more faults, the requests under
   way finish (bounded by the lost timeout), a rollout under way ends, every board gets
   `END_GRACE_S` to be SERVING again, a last audit read and sample.
4. `conclude` (figures, verdict, report) -> `<out>/soak.json`, `plot` -> `<out>/soak.png`. The
   fleet is stopped in every case.

SIGINT / SIGTERM end the soak phase early and go to step 4 (the verdict then fails: interrupted);
a second one also skips the waits. Runs on the main thread's event loop (the fleets' children
follow the thread that started them).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import openai

from calculet.daemon.package.manifest import load_manifest
from calculet.ops.bench.device_model import DeviceModel
from calculet.ops.bench.multiturn.tokenizer import counter_from_file
from calculet.ops.commands.up import ensure_package
from calculet.ops.fleet import LocalFleet
from calculet.ops.soak.audit import AuditBook
from calculet.ops.soak.capacity import SoakCapacity, calibrated, long_context_rate, modelled
from calculet.ops.soak.chaos import Chaos, FaultRecord, SwitchFault
from calculet.ops.soak.conclude import RunFacts, conclude
from calculet.ops.soak.fault_plan import cycle_kinds, plan_faults, reset_budget
from calculet.ops.soak.fleets import (
    free_port,
    prepare_packages,
    reference_fleet_config,
    soak_daemon_args,
    soak_fleet_config,
)
from calculet.ops.soak.growth import ProcessSeries
from calculet.ops.soak.mix import LONG_CONTEXT_KIND, RequestSpec, build_pool, burst_specs, mix_shape
from calculet.ops.soak.plot import plot_available, write_plot
from calculet.ops.soak.references import ReferenceBook
from calculet.ops.soak.sampler import UsageSampler
from calculet.ops.soak.settings import SoakSettings, cycle_floor_for, job_timeout_for, lost_timeout_for
from calculet.ops.soak.supervisor import Supervisor
from calculet.ops.soak.tally import Tally
from calculet.ops.soak.timeline import Timeline
from calculet.ops.soak.traffic import TrafficRunner
from calculet.ops.soak.verdict import SoakVerdict
from calculet.ops.soak.versions import versions

STARTUP_TIMEOUT_S = 180.0
END_GRACE_S = 120.0
ROLLOUT_END_S = 240.0
HURRY_S = 5.0


@dataclass(frozen=True)
class SoakOutcome:
    """The report written and its verdict."""

    report: dict[str, Any]
    verdict: SoakVerdict
    json_path: Path
    plot_path: Path | None


@dataclass(frozen=True)
class _Traffic:
    """What the soak sends: the main pool (the calibrated mix), the `long_context` specs and their
    own rate (`capacity.long_context_rate`), and the lost timeout that covers the longest."""

    pool: list[RequestSpec]
    long: list[RequestSpec]
    long_rate: float
    lost_timeout_s: float

    @property
    def main(self) -> list[RequestSpec]:
        return [spec for spec in self.pool if spec.kind != LONG_CONTEXT_KIND]


@dataclass
class _Phase:
    """What the soak phase leaves for the report."""

    duration_s: float = 0.0
    series: list[ProcessSeries] = field(default_factory=list)
    faults: list[FaultRecord] = field(default_factory=list)


class SoakRun:
    """One run (module docstring).

    Args:
        settings: what to run.
        say: progress output, one line at a time.
    """

    def __init__(self, settings: SoakSettings, say: Callable[[str], None] = print) -> None:
        self.s = settings
        self.say = say
        self.timeline = Timeline()
        self.stop = asyncio.Event()
        self.signals = 0
        self.fatal: list[str] = []
        self.timings: dict[str, float] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    # ------------------------------------------------------------------ signals

    def _on_signal(self, signum: int, frame: types.FrameType | None) -> None:
        self.signals += 1
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self.stop.set)

    @contextlib.contextmanager
    def _signals(self) -> Iterator[None]:
        old = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in old.items():
                signal.signal(sig, handler)

    def _hurry(self, seconds: float) -> float:
        return HURRY_S if self.signals > 1 else seconds

    def _cancelled(self) -> bool:
        return self.signals > 0

    # ------------------------------------------------------------------ the run

    async def run(self) -> SoakOutcome:
        """Everything (module docstring); once the soak fleet is up, the report is written whatever
        happens.

        Raises:
            FleetError: the packages could not be prepared or a fleet could not start.
            CalculetError: the references could not be computed.
        """
        self._loop = asyncio.get_running_loop()
        s = self.s
        s.out.mkdir(parents=True, exist_ok=True)
        with self._signals():
            started = self.timeline.now()
            package, copy = prepare_packages(s.models, s.preset, self.say)
            if s.switch_model is not None:
                ensure_package(s.models, s.switch_model, self.say)
            model = DeviceModel.from_package(package)
            counter = counter_from_file(package / load_manifest(package).tokenizer.path)
            shape = mix_shape(model.context)
            pool = build_pool(s.pool_size, s.seed, shape, counter)
            kinds = _kind_counts(pool)
            self.say(f"soak: a pool of {len(pool)} requests ({_join(kinds)}), lane context {model.context}")
            book = await self._references(pool, s.preset, "reference")
            burst = burst_specs(pool)
            switch_book = None
            if s.switch_model is not None:
                switch_book = await self._references(burst, s.switch_model, f"reference-{s.switch_model}")
            self.timings["preparation_s"] = self.timeline.now() - started
            job_timeout = job_timeout_for(model, pool, s.time_scale)
            self.s = s = replace(s, cycle_floor_s=cycle_floor_for(job_timeout))
            limit, window = reset_budget(s.cycle_s)
            long_specs = [spec for spec in pool if spec.kind == LONG_CONTEXT_KIND]
            long_rate = long_context_rate(model, long_specs, s.boards, s.wall_per_board)
            lost_timeout = lost_timeout_for(model, pool, s.time_scale, s.lost_timeout_s, job_timeout)
            daemon_args = soak_daemon_args(job_timeout, limit, window)
            config = soak_fleet_config(
                s.out, s.models, s.presets, s.boards, s.time_scale, daemon_args, free_port(), s.policy
            )
            fleet = LocalFleet(config)
            self.say(
                f"soak: starting {s.boards} board(s) at time scale {s.time_scale:g} ({s.policy}; "
                f"{s.duration_s:g} board-s = {s.phase_s:g} wall-s): {' '.join(daemon_args)}"
            )
            fleet.start(STARTUP_TIMEOUT_S, cancelled=self._cancelled)
            try:
                fleet.wait_ready(STARTUP_TIMEOUT_S, cancelled=self._cancelled)
                run_config = {
                    **s.describe(),
                    "gateway": fleet.base_url,
                    "pool": {"size": len(pool), "kinds": kinds, "shape": shape.describe()},
                    "daemon_flags": list(daemon_args),
                    "gateway_flags": list(config.gateway_args),
                    "job_timeout_s": job_timeout,
                    "lost_timeout_wall_s": lost_timeout,
                    "long_context": {"specs": len(long_specs), "arrivals_per_wall_s": round(long_rate, 6)},
                    "reset_limit": limit,
                    "reset_window_s": window,
                    "packages": [package.name, copy.name],
                }
                switch = (burst, switch_book) if switch_book is not None else None
                traffic = _Traffic(pool, long_specs, long_rate, lost_timeout)
                facts = await self._soak(fleet, traffic, book, model, (package.name, copy.name), run_config, switch)
            finally:
                fleet.stop(hurry=lambda: self.signals > 1)
        report, verdict = conclude(facts)
        return self._write(report, verdict)

    async def _references(self, pool: list[RequestSpec], preset: str, name: str) -> ReferenceBook:
        """`preset`'s answers to `pool`, cached in `<out>/references[-B].json`, from a reference
        fleet in `<out>/<name>` when the cache lacks some."""
        s = self.s
        label = name.replace("reference", "references", 1)
        cache = s.out / f"{label}.json"
        book = ReferenceBook(cache)
        missing = book.missing(pool, preset)
        started = self.timeline.now()
        if not missing:
            await book.fill(pool, None, preset)
            self.say(f"soak: every reference answer came from {cache}")
            return book
        fleet = LocalFleet(reference_fleet_config(s.out, s.models, preset, free_port(), name))
        self.say(f"soak: starting the reference fleet of {preset} (1 clean board, time scale 0): {missing} request(s)")
        fleet.start(STARTUP_TIMEOUT_S, cancelled=self._cancelled)
        try:
            fleet.wait_ready(STARTUP_TIMEOUT_S, cancelled=self._cancelled)
            step = max(1, len(pool) // 10)

            def progress(done: int, total: int) -> None:
                if done % step == 0 or done == total:
                    self.say(f"soak: references {done}/{total}")

            async with _client(fleet.base_url, 600.0) as client:
                await book.fill(pool, client, preset, progress)
        finally:
            book.save()
            fleet.stop()
        self.timings[f"{label}_s"] = self.timeline.now() - started
        self.say(f"soak: {book.asked} reference request(s) of {preset} in {self.timings[f'{label}_s']:.1f} s")
        return book

    async def _soak(
        self,
        fleet: LocalFleet,
        traffic: _Traffic,
        book: ReferenceBook,
        model: DeviceModel,
        packages: tuple[str, str],
        config: dict[str, Any],
        switch: tuple[list[RequestSpec], ReferenceBook] | None = None,
    ) -> RunFacts:
        s = self.s
        audit = AuditBook()
        supervisor = Supervisor(fleet, audit, self.timeline, self.say, on_fatal=self.stop.set)
        capacity: SoakCapacity | None = None
        phase = _Phase()
        async with _client(fleet.base_url, traffic.lost_timeout_s) as client:
            runner = TrafficRunner(
                client, s.preset, traffic.main, book, self.timeline, lost_timeout_s=traffic.lost_timeout_s, seed=s.seed
            )
            try:
                capacity = await self._capacity(runner, model)
            except ValueError as err:
                self.fatal.append(f"capacity: {err}")
            calibration, runner.tally = runner.tally, Tally()
            if capacity is not None and not self.stop.is_set():
                runner.typical_e2e_s = capacity.typical_e2e_s
                phase = await self._phase(fleet, runner, supervisor, packages, capacity, traffic, switch)
            elif self.signals:
                self.fatal.append("interrupted before the soak phase")
        boards_at_end = {b.name: b.serving and fleet.daemons[b.index].alive() for b in supervisor.boards}
        return RunFacts(
            settings=s,
            config=config,
            versions=versions(),
            capacity=capacity,
            tallies={"calibration": calibration, "soak": runner.tally},
            duration_s=phase.duration_s,
            series=phase.series,
            faults=phase.faults,
            exits=supervisor.record.exits,
            actions=supervisor.record.actions,
            budget_exhausted=supervisor.record.budget_exhausted,
            stuck=supervisor.record.stuck,
            audit=audit,
            boards_at_end=boards_at_end,
            fatal=self.fatal,
            timings=self.timings,
            references={"cache": str(s.out / "references.json"), "asked": book.asked},
        )

    async def _capacity(self, runner: TrafficRunner, model: DeviceModel) -> SoakCapacity:
        """What the fleet delivers on this host, measured: a closed loop of one client per lane. The
        timing-model limit is an upper bound two emulated boards, the gateway and the clients on a
        small host do not reach (0.8 of it measured on 2 cores), so 0.7 of it overloads them; it is
        reported beside the measurement."""
        s = self.s
        seconds = s.calibration_wall_s
        concurrency = s.boards * model.lanes
        self.say(f"soak: calibrating: a closed loop of {concurrency} clients for {seconds:g} s")
        measured = await runner.run_closed(concurrency, seconds)
        detail: dict[str, Any] = {"calibration_s": seconds, "concurrency": concurrency, "arrivals": runner.sent}
        if s.time_scale > 0:
            limit = modelled(model, runner.pool, s.boards, s.time_scale, s.load)
            detail["timing_model_capacity_arrivals_per_s"] = round(limit.capacity_per_s, 4)
            detail["measured_share_of_timing_model"] = round(measured / limit.capacity_per_s, 3)
        plan = calibrated(measured, runner.e2e_samples, s.load, detail)
        self.say(
            f"soak: capacity {plan.capacity_per_s:.3f} arrivals/s ({plan.method}); load {s.load:g} -> "
            f"{plan.rate_per_s:.3f} arrivals/s; typical end-to-end {plan.typical_e2e_s:.3f} s"
        )
        return plan

    async def _phase(
        self,
        fleet: LocalFleet,
        runner: TrafficRunner,
        supervisor: Supervisor,
        packages: tuple[str, str],
        capacity: SoakCapacity,
        traffic: _Traffic,
        switch: tuple[list[RequestSpec], ReferenceBook] | None = None,
    ) -> _Phase:
        """The soak phase (module docstring, step 3)."""
        s = self.s
        kinds = cycle_kinds(switch is not None, s.boards)
        plan = plan_faults(s.phase_s, s.boards, s.cycle_s, kinds) if s.faults else []
        sampler = UsageSampler(lambda: _running(fleet), self.timeline)
        model_switch = None
        if switch is not None and s.switch_model is not None:
            specs, switch_book = switch
            alias = s.switch_model
            model_switch = SwitchFault(alias, lambda: runner.run_for(alias, switch_book, specs))
        chaos = Chaos(
            plan, supervisor, self.timeline, alias=s.preset, packages=packages, gateway_url=fleet.base_url,
            log_dir=s.out / "logs", say=self.say, switch=model_switch,
        )  # fmt: skip
        watch_stop, chaos_stop = asyncio.Event(), asyncio.Event()
        self.timeline.start()
        self.say(
            f"soak: {s.phase_s:g} wall-s at {capacity.rate_per_s:.3f} arrivals/s, {len(plan)} fault(s) on a "
            f"{s.cycle_s:g} s cycle, warm-up {s.warmup:g} s"
        )
        tasks = [
            asyncio.create_task(supervisor.run(watch_stop)),
            asyncio.create_task(sampler.run(s.sample_wall_s, watch_stop)),
            asyncio.create_task(self._progress(runner, supervisor, chaos, watch_stop)),
        ]
        chaos_task = asyncio.create_task(chaos.run(chaos_stop))
        duration = s.phase_s
        try:
            await runner.run_open(capacity.rate_per_s, s.phase_s, self.stop, (traffic.long, traffic.long_rate))
            duration = min(s.phase_s, self.timeline.now())
            chaos_stop.set()
            await chaos_task
            self.say(f"soak: arrivals ended at {duration:.1f} s; waiting for {runner.in_flight} request(s)")
            left = await runner.wait_in_flight(self._hurry(traffic.lost_timeout_s + 30.0))
            if left:
                self.fatal.append(f"{left} request(s) still running long after the lost timeout")
            await chaos.finish(self._hurry(ROLLOUT_END_S))
            if not await supervisor.wait_whole(self._hurry(END_GRACE_S)):
                self.say("soak: not every board is SERVING after the grace period")
            await supervisor.read_all()
            sampler.sample()
        finally:
            chaos_stop.set()
            watch_stop.set()
            await asyncio.gather(chaos_task, *tasks, return_exceptions=True)
        self.fatal += supervisor.record.fatal
        if self.signals:
            self.fatal.append(f"interrupted by a signal at {duration:.0f} s")
        self.timings["soak_phase_s"] = duration
        self.timings["wind_down_s"] = self.timeline.now() - duration
        return _Phase(duration, sampler.series(), chaos.records)

    async def _progress(self, runner: TrafficRunner, supervisor: Supervisor, chaos: Chaos, stop: asyncio.Event) -> None:
        every = max(10.0, min(60.0, self.s.phase_s / 20))
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), every)
            counts = _join(dict(sorted(runner.tally.by_class.items()))) or "-"
            serving = f"{len(supervisor.serving_boards())}/{len(supervisor.boards)}"
            self.say(
                f"soak: {self.timeline.now():7.1f} s: sent {runner.sent}, in flight {runner.in_flight}, {counts}; "
                f"faults {len(chaos.records)}, restarts {len(supervisor.record.exits)}, boards serving {serving}"
            )

    def _write(self, report: dict[str, Any], verdict: SoakVerdict) -> SoakOutcome:
        out = self.s.out
        json_path = out / "soak.json"
        tmp = json_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
        tmp.replace(json_path)
        plot_path: Path | None = out / "soak.png"
        if not plot_available():
            self.say("soak: no matplotlib, so no soak.png (pip install 'calculet[bench]')")
            plot_path = None
        else:
            try:
                write_plot(out / "soak.png", report, report["processes"])
            except (OSError, ValueError) as err:
                self.say(f"soak: soak.png not written: {err}")
                plot_path = None
        return SoakOutcome(report, verdict, json_path, plot_path)


def _client(base_url: str, timeout_s: float) -> openai.AsyncOpenAI:
    """An `AsyncOpenAI` for a local gateway: no retries, no proxies (openai's default pool: up to
    1,000 connections, far above what the soak keeps in flight)."""
    http = openai.DefaultAsyncHttpxClient(trust_env=False)
    return openai.AsyncOpenAI(
        base_url=f"{base_url}/v1", api_key="calctl-soak", max_retries=0, timeout=timeout_s, http_client=http
    )


def _running(fleet: LocalFleet) -> list[tuple[str, str, int]]:
    """The fleet's processes now running, for the sampler."""
    return [(c.name, c.role, c.pid) for c in fleet.children() if c.alive()]


def _kind_counts(pool: list[RequestSpec]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for spec in pool:
        counts[spec.kind] = counts.get(spec.kind, 0) + 1
    return counts


def _join(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in counts.items())
