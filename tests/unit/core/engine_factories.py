"""Small factories for engine tests: calsim packages, an in-process DeviceCore, requests."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from calculet.daemon.core.config import DaemonConfig
from calculet.daemon.core.device_core import DeviceCore
from calculet.daemon.core.events import FinalEvent, wait_finished
from calculet.daemon.core.kv import LaneState
from calculet.daemon.core.offset_probe import PROBE_JOBS
from calculet.daemon.core.request import GenerationRequest, StoppingParams
from calculet.daemon.sampling.params import SamplingParams
from calculet.ops.sim_packages.build import build_sim_package

WARM_UP_JOBS = 9 + PROBE_JOBS
"""Device jobs a tiny load runs before any traffic: the golden check's (one prefill, 8 decode steps)
and the offset check's (`offset_probe.PROBE_JOBS`); a fault plan's job index counts them."""


def build_models(root: Path) -> Path:
    build_sim_package("tiny", root / "tiny")
    build_sim_package("qwen3-30b-a3b", root / "qwen", decode_batches=(1, 4), lanes=4, lane_context=2048)
    return root


@contextmanager
def running_core(
    models_root: Path,
    *,
    model: str = "tiny",
    before_start: Callable[[DeviceCore], object] | None = None,
    **overrides: Any,
) -> Iterator[DeviceCore]:
    # calsim-dev holds two models, so tests may load a second model or a new generation beside the
    # first; tests of the one-calbin board (CalRT 0.7.6, calsim's default) ask for calrt-0.7.6.
    options = {"time_scale": 0.0, "profile": "calsim-dev", **overrides.pop("device_options", {})}
    config = DaemonConfig(models_root=models_root, models=((model, model),), device_options=options, **overrides)
    core = DeviceCore(config)
    if before_start is not None:
        before_start(core)
    core.start()
    try:
        yield core
    finally:
        core.close()


def request(
    prompt: tuple[int, ...], max_tokens: int, seed: int, temperature: float = 0.0, **kw: Any
) -> GenerationRequest:
    model = kw.pop("model", "tiny")
    priority = kw.pop("priority", 0)
    stopping = StoppingParams(max_tokens=max_tokens, ignore_eos=kw.pop("ignore_eos", True))
    sampling = SamplingParams(seed=seed, temperature=temperature, **kw)
    return GenerationRequest(model, prompt, sampling, stopping, priority=priority)


def assert_clean(core: DeviceCore, *, quarantine_ok: bool = True) -> None:
    """Nothing leaked: no job, no device job, no buffer in use (nor quarantined unless
    `quarantine_ok`), and every lane owned by no one (FREE, or PARKED: a finished job's KV kept warm,
    which counts as free)."""
    status = core.status()
    assert not status.jobs, status.jobs
    assert status.inflight == 0
    assert status.pool.in_use == 0, status.pool
    assert quarantine_ok or status.pool.quarantined == 0, status.pool
    for m in status.models:
        idle = all(lane.state in (LaneState.FREE, LaneState.PARKED) and lane.owner is None for lane in m.lanes)
        assert idle, m.lanes


def finished_events(core: DeviceCore, job_id: str, timeout: float = 30.0) -> list[Any]:
    """Every event of a job once it finished, its Final last."""
    log = core.event_log(job_id, for_wait=False)
    assert wait_finished(log, timeout), f"job {job_id} did not finish"
    events = log.read(0)
    assert isinstance(events[-1], FinalEvent)
    return events


def finish(core: DeviceCore, job_id: str, timeout: float = 30.0) -> tuple[list[int], FinalEvent]:
    events = finished_events(core, job_id, timeout)
    return [t for e in events[:-1] for t in getattr(e, "tokens", ())], events[-1]


def generate_all(core: DeviceCore, reqs: list[GenerationRequest]) -> list[list[int]]:
    """Submit everything at once, then collect (the engine batches them)."""
    ids = [core.submit(r).job_id for r in reqs]
    return [finish(core, j)[0] for j in ids]


def generate_each(core: DeviceCore, reqs: list[GenerationRequest]) -> list[list[int]]:
    """One at a time: the undisturbed reference."""
    return [finish(core, core.submit(r).job_id)[0] for r in reqs]


def until(what: str, check: Callable[[], bool], timeout: float = 20.0) -> None:
    """Wait for a state the test cannot be told about by an event (a job reaching the device);
    fails after `timeout` seconds instead of hanging the suite."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def use_up_recoveries(core: DeviceCore, job_id: str) -> None:
    """White-box set-up (not an API): give a live job the recovery count at which its next lost KV
    ends it, so a test can count a reset that fails one job among many."""
    engine = core.engine
    with engine._cond:
        seq = engine._jobs.get(job_id)
        assert seq is not None
        seq.recoveries = engine.config.max_recoveries


class OwnerLock:
    """A lock that knows which thread holds it (`threading.Lock` does not: `Condition._is_owned` on
    one says whether *any* thread holds it)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._owner: int | None = None

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if self._lock.acquire(blocking, timeout):
            self._owner = threading.get_ident()
            return True
        return False

    def release(self) -> None:
        self._owner = None
        self._lock.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

    def held_here(self) -> bool:
        """The calling thread holds it."""
        return self._owner == threading.get_ident()


def track_engine_lock(core: DeviceCore) -> OwnerLock:
    """White-box (tests only): give a core's engine, before `start`, a lock that knows its holder (and
    to its reset controller and its generation operations, which share the engine's lock)."""
    lock = OwnerLock()
    cond = threading.Condition(lock)  # type: ignore[arg-type]
    core.engine._cond = cond
    core.engine._resets._cond = cond
    core.engine._generation_ops._cond = cond
    return lock
