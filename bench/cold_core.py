"""How much slower the same host code runs right after its thread slept (issue 22): not a test.

With one decode cohort the host's path between two device steps (`bench/step_gap.py`) starts on a
thread that slept through the step. On our 2-core VMs that code runs several times slower than in
a hot loop, whatever it does; the daemon's per-step phases in situ are accordingly several times
their micro-benchmarks. This times one small piece of sampler-like Python and numpy (argsort,
fancy indexing, a cumulative sum over 256 values, four times) in one thread, after each of:

    hot      nothing (back to back)
    sleep    time.sleep(step): the core idles, as a host thread does through a device step
    spin     a busy loop of the same length (no idle: what is left is not the core's sleep)
    thrash   touching 8 MB (the caches evicted, the core awake)

    .venv/bin/python bench/cold_core.py [--step-ms 17] [--rounds 80]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np


def work(ids: np.ndarray, vals: np.ndarray) -> int:
    total = 0
    for _ in range(4):
        by_id = np.argsort(ids, kind="stable")
        kept = vals[by_id]
        cum = np.cumsum(kept, dtype=np.float64)
        total += int(np.searchsorted(cum, float(cum[-1]) / 2)) + int(ids[by_id][0])
    return total


def median_us(before: Callable[[], object], rounds: int, ids: np.ndarray, vals: np.ndarray) -> float:
    times = []
    for _ in range(rounds):
        before()
        began = time.perf_counter()
        work(ids, vals)
        times.append(time.perf_counter() - began)
    return statistics.median(times) * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--step-ms", type=float, default=17.0, help="the idle (a device step) before each run")
    p.add_argument("--rounds", type=int, default=80)
    args = p.parse_args()
    step = args.step_ms / 1000
    rng = np.random.default_rng(0)
    ids = rng.permutation(151_936)[:256].astype(np.int64)
    vals = rng.standard_normal(256).astype(np.float32)
    big = np.zeros(8 << 20, dtype=np.uint8)

    def spin() -> None:
        end = time.perf_counter() + step
        while time.perf_counter() < end:
            pass

    def thrash() -> None:
        big[::64] += 1

    cases: dict[str, Callable[[], object]] = {
        "hot": lambda: None,
        "sleep": lambda: time.sleep(step),
        "spin": spin,
        "thrash": thrash,
    }
    hot = median_us(cases["hot"], args.rounds, ids, vals)
    for name, before in cases.items():
        us = hot if name == "hot" else median_us(before, args.rounds, ids, vals)
        print(f"{name:7s} {us:8.1f} us  x{us / hot:4.1f}")


if __name__ == "__main__":
    main()
