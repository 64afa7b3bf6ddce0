"""Small factories for engine tests: calsim packages, an in-process DeviceCore, requests."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from calculet.daemon.core.config import DaemonConfig
from calculet.daemon.core.device_core import DeviceCore
from calculet.daemon.core.events import FinalEvent, wait_finished
from calculet.daemon.core.request import GenerationRequest, StoppingParams
from calculet.daemon.sampling.params import SamplingParams
from calculet.ops.sim_packages.build import build_sim_package


def build_models(root: Path) -> Path:
    build_sim_package("tiny", root / "tiny")
    build_sim_package("qwen3-30b-a3b", root / "qwen", decode_batches=(1, 4), lanes=4, lane_context=2048)
    return root


@contextmanager
def running_core(models_root: Path, *, model: str = "tiny", **overrides: Any) -> Iterator[DeviceCore]:
    options = {"time_scale": 0.0, **overrides.pop("device_options", {})}
    config = DaemonConfig(models_root=models_root, models=((model, model),), device_options=options, **overrides)
    core = DeviceCore(config)
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


def finish(core: DeviceCore, job_id: str, timeout: float = 30.0) -> tuple[list[int], FinalEvent]:
    log = core.event_log(job_id, for_wait=False)
    assert wait_finished(log, timeout), f"job {job_id} did not finish"
    events = log.read(0)
    final = events[-1]
    assert isinstance(final, FinalEvent)
    return [t for e in events[:-1] for t in getattr(e, "tokens", ())], final


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
