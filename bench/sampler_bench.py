"""Sampler cost per token at the Qwen vocabulary (151,936), batch 1/4/16, default vs serial policy.

Not a test: prints a table of microseconds per `sample()` call and per row (median and p90 over
`--iters` calls). Inputs are language-model-shaped BF16 logits (N(0, 2) bulk plus a few peaks), a
fresh batch per call from a pool of `--pool` batches so the logits are not all cache-hot, and a
history of 1,000 prompt + 200 generated tokens for the penalties case.

    .venv/bin/python bench/sampler_bench.py [--iters 200] [--batches 1,4,16]
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace

import ml_dtypes
import numpy as np

from calculet.daemon.sampling import RowSampling, Sampler, SamplingParams, SamplingPolicy, TokenHistory

VOCAB = 151_936

CASES: dict[str, SamplingParams] = {
    "greedy": SamplingParams(temperature=0.0),
    "temperature": SamplingParams(temperature=0.8),
    "top_k=50": SamplingParams(temperature=0.8, top_k=50),
    "top_k=40+top_p=0.95": SamplingParams(temperature=0.8, top_k=40, top_p=0.95),
    "top_p=0.9": SamplingParams(temperature=0.8, top_p=0.9),
    "top_k+top_p+min_p": SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05),
    "penalties+top_p": SamplingParams(
        temperature=0.8, top_p=0.9, repetition_penalty=1.1, presence_penalty=0.3, frequency_penalty=0.3
    ),
    "logprobs=5 (greedy)": SamplingParams(temperature=0.0, logprobs=5),
}


def llm_like(rows: int, rng: np.random.Generator) -> np.ndarray:
    x = rng.standard_normal((rows, VOCAB), dtype=np.float32) * 2.0
    for r in range(rows):
        x[r, rng.choice(VOCAB, size=5, replace=False)] = [16.0, 15.0, 14.0, 13.0, 12.0]
    return x.astype(ml_dtypes.bfloat16)


def measure(sampler: Sampler, pool: list[np.ndarray], params: SamplingParams, iters: int) -> list[float]:
    b = pool[0].shape[0]
    histories = [TokenHistory(VOCAB, np.arange(i, i + 3000, 3), np.arange(500 + i, 700 + i)) for i in range(b)]
    times: list[float] = []
    for it in range(iters + 3):
        rows = [RowSampling(replace(params, seed=it * b + r), it, histories[r]) for r in range(b)]
        x = pool[it % len(pool)]
        t0 = time.perf_counter_ns()
        sampler.sample(x, rows)
        if it >= 3:  # warm-up calls are not counted
            times.append((time.perf_counter_ns() - t0) / 1000.0)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--pool", type=int, default=8, help="distinct logits batches cycled through")
    ap.add_argument("--batches", default="1,4,16")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    print(f"vocab {VOCAB}; us per call and per row: median (p90); {args.iters} calls each")
    print(f"{'case':22s} {'B':>3s} {'default/call':>18s} {'/row':>8s} {'serial/call':>18s} {'/row':>8s} {'ratio':>6s}")
    for b in (int(s) for s in args.batches.split(",")):
        pool = [llm_like(b, rng) for _ in range(args.pool)]
        samplers = {p: Sampler(VOCAB, b, policy=p) for p in SamplingPolicy}
        for name, params in CASES.items():
            med: dict[SamplingPolicy, float] = {}
            cells = []
            for policy in (SamplingPolicy.DEFAULT, SamplingPolicy.SERIAL):
                t = measure(samplers[policy], pool, params, args.iters)
                med[policy] = statistics.median(t)
                p90 = statistics.quantiles(t, n=10)[-1]
                cells.append(f"{med[policy]:9.0f} ({p90:6.0f}) {med[policy] / b:8.1f}")
            ratio = med[SamplingPolicy.SERIAL] / med[SamplingPolicy.DEFAULT]
            print(f"{name:22s} {b:3d} {cells[0]} {cells[1]} {ratio:6.2f}")


if __name__ == "__main__":
    main()
