"""Where the host's time between two decode steps goes (issue 22, item 2): in-process, no gRPC.

Not a test. With lanes equal to one decode batch, step N + 1 needs step N's tokens, so everything
the host does from the device's end of step N (calsim's D2H end) to its acceptance of step N + 1
is time the device idles: saturation is step / (step + gap). This runs a `DeviceCore` on a calsim
qwen3-30b-a3b package at time scale 1 (decode batch B, B lanes, B requests decoding together) and
timestamps each step's path through the host with `perf_counter`:

    device end -> completion thread awake (calsim's `deliver` copies the outputs into the host
    buffers on the way) -> sampled -> settled and applied (tokens, KV commits, bookkeeping; the
    job retired) -> the next job planned and prepared (by the completion thread itself, or by the
    engine thread it wakes with `launch_from_completion` off) and its submit begun -> the device
    accepts it.

Each phase is reported as its median over the steps, and the gap against the modelled step. The
daemon adds to this its gRPC loop (streaming, Submit) competing for the GIL, so a served board's gap
is larger; `bench/host_cpu.py` and `calctl bench` measure that.

    .venv/bin/python bench/step_gap.py [--batches 1,4,8,16] [--modes full,topk] [--temperature 0]
        [--launch completion|engine]   # which thread launches the next job (A/B; default completion)
        [--metrics]                    # the served daemon's metrics observer attached, as in a daemon
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from calculet.daemon.calsim import engine as calsim_engine
from calculet.daemon.core import completion, executor
from calculet.daemon.core import engine as core_engine
from calculet.daemon.core.config import DaemonConfig
from calculet.daemon.core.device_core import DeviceCore
from calculet.daemon.core.engine_types import EngineConfig
from calculet.daemon.core.events import wait_finished
from calculet.daemon.core.request import GenerationRequest, StoppingParams
from calculet.daemon.sampling.params import SamplingParams
from calculet.daemon.telemetry.daemon_metrics import DaemonMetrics
from calculet.ops.sim_packages.build import build_sim_package

PHASES = ("device end", "completion awake", "sampled", "applied", "next submit", "device accepts")
MARKS: list[tuple[str, float]] = []


def _marking(owner: Any, name: str, before: str | None, after: str | None) -> None:
    original: Callable[..., Any] = getattr(owner, name)

    def marked(*args: Any, **kwargs: Any) -> Any:
        if before:
            MARKS.append((before, time.perf_counter()))
        result = original(*args, **kwargs)
        if after:
            MARKS.append((after, time.perf_counter()))
        return result

    setattr(owner, name, marked)


def instrument() -> None:
    _marking(calsim_engine.ComputeEngine, "_end", "device end", None)
    _marking(calsim_engine.ComputeEngine, "accept", "device accepts", None)
    _marking(core_engine.Engine, "_complete", "completion awake", None)
    _marking(completion, "sample", None, "sampled")
    _marking(executor.Executor, "retire", None, "applied")
    _marking(core_engine.Engine, "_submit_device_job", "next submit", None)


def steps() -> list[dict[str, float]]:
    """Each device end followed by the whole path to the next acceptance, as phase -> time, with
    the device end after that acceptance ("next end": the device's own time is between them)."""
    found = []
    for i, (name, _) in enumerate(MARKS):
        if name != "device end":
            continue
        path: dict[str, float] = {}
        for later, t in MARKS[i : i + 24]:
            if later == "device end" and "device accepts" in path:
                path["next end"] = t
                break
            path.setdefault(later, t)
        if all(p in path for p in PHASES) and "next end" in path:
            found.append(path)
    return found


def launch_from_engine_thread() -> None:
    """The A/B: the engine thread launches every job (`EngineConfig.launch_from_completion` off)."""
    original = DaemonConfig.engine_config

    def engine_config(self: DaemonConfig) -> EngineConfig:
        return dataclasses.replace(original(self), launch_from_completion=False)

    DaemonConfig.engine_config = engine_config  # type: ignore[method-assign]


def run(batch: int, mode: str, temperature: float, tokens: int, metrics: bool = False) -> list[dict[str, float]]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        build_sim_package(
            "qwen3-30b-a3b",
            root / "qwen",
            decode_batches=(batch,),
            lanes=batch,
            logits_topk=256 if mode == "topk" else 0,
        )
        options = {"time_scale": 1.0, "profile": "calsim-dev"}
        config = DaemonConfig(models_root=root, models=(("qwen", "qwen"),), device_options=options, max_inflight=2)
        core = DeviceCore(config)
        observed = DaemonMetrics(core) if metrics else None  # its observer, fed per device job
        core.start()
        try:
            MARKS.clear()
            ids = []
            for i in range(batch):
                sampling = SamplingParams(seed=i, temperature=temperature)
                req = GenerationRequest(
                    "qwen", (1000 + i, 2000, 3000), sampling, StoppingParams(tokens, ignore_eos=True)
                )
                ids.append(core.submit(req).job_id)
            for job_id in ids:
                if not wait_finished(core.event_log(job_id, for_wait=False), 600):
                    raise SystemExit(f"job {job_id} did not finish")
        finally:
            core.close()
            if observed is not None:
                observed.close()
    return steps()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", default="1,4,8,16")
    p.add_argument("--modes", default="full,topk", help="logits output of the package: full, topk (K 256)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--tokens", type=int, default=64, help="output tokens per request")
    p.add_argument("--launch", choices=("completion", "engine"), default="completion", help="the launching thread")
    p.add_argument("--metrics", action="store_true", help="attach the daemon's metrics observer")
    args = p.parse_args()
    instrument()
    if args.launch == "engine":
        launch_from_engine_thread()
    header = " -> ".join(PHASES)
    print(f"phases (median ms): {header}; gap = device end -> device accepts")
    for mode in args.modes.split(","):
        for batch in (int(b) for b in args.batches.split(",")):
            found = run(batch, mode, args.temperature, args.tokens, args.metrics)
            cells = []
            for a, b in itertools.pairwise(PHASES):
                cells.append(f"{statistics.median(s[b] - s[a] for s in found) * 1e3:.3f}")
            gap = statistics.median(s["device accepts"] - s["device end"] for s in found)
            device = statistics.median(s["next end"] - s["device accepts"] for s in found)
            print(
                f"{mode:4s} b{batch:<2d} steps {len(found):4d}  phases {' / '.join(cells)}  gap {gap * 1e3:.3f} ms  "
                f"device {device * 1e3:.2f} ms  device/(device+gap) {device / (device + gap):.3f}"
            )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
