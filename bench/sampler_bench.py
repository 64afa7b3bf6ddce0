"""Sampler cost per token at the Qwen vocabulary (151,936), batch 1/4/16, default vs serial policy.

Not a test: prints a table of microseconds per `sample()` call and per row (median and p90 over
`--iters` calls). Inputs are language-model-shaped BF16 logits (N(0, 2) bulk plus a few peaks), a
fresh batch per call from a pool of `--pool` batches so the logits are not all cache-hot, and a
history of 1,000 prompt + 200 generated tokens for the penalties case.

    .venv/bin/python bench/sampler_bench.py [--iters 200] [--batches 1,4,16]
    .venv/bin/python bench/sampler_bench.py --topk 256 [--iters 200] [--batches 1,16]

With `--topk K`: the default policy on full rows against `sample_topk` on what a top-k device job
would return (`device_topk`, computed before the clock starts, as the device would), per case: the
host's us per row both ways and the share of rows whose full row had to be read (the bytes of that
read are not timed here: it is the device's D2H).
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace

import ml_dtypes
import numpy as np

from calculet.daemon.sampling import RowSampling, Sampler, SamplingParams, SamplingPolicy, TokenHistory
from calculet.daemon.sampling.topk import TopkRows, device_topk

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


def measure_topk(
    sampler: Sampler, pool: list[tuple[np.ndarray, TopkRows]], params: SamplingParams, iters: int
) -> tuple[list[float], list[float], float]:
    """(full-row us per call, top-k us per call, share of rows read) over `iters` calls."""
    b = pool[0][0].shape[0]
    histories = [TokenHistory(VOCAB, np.arange(i, i + 3000, 3), np.arange(500 + i, 700 + i)) for i in range(b)]
    full_t: list[float] = []
    top_t: list[float] = []
    reads = rows_done = 0
    for it in range(iters + 3):
        rows = [RowSampling(replace(params, seed=it * b + r), it, histories[r]) for r in range(b)]
        x, top = pool[it % len(pool)]
        t0 = time.perf_counter_ns()
        expected = sampler.sample(x, rows)
        t1 = time.perf_counter_ns()
        got, tally = sampler.sample_topk(top, rows, lambda r, x=x: x[r])  # type: ignore[misc]
        t2 = time.perf_counter_ns()
        assert got == expected, "top-k sampling must give the full path's tokens"
        if it >= 3:
            full_t.append((t1 - t0) / 1000.0)
            top_t.append((t2 - t1) / 1000.0)
            reads += tally.full_reads
            rows_done += b
    return full_t, top_t, reads / rows_done


def topk_table(args: argparse.Namespace, rng: np.random.Generator) -> None:
    k = args.topk
    print(f"vocab {VOCAB}; top-k output K = {k}; us per row, median over {args.iters} calls")
    print(f"{'case':22s} {'B':>3s} {'full/row':>9s} {'top-k/row':>10s} {'ratio':>6s} {'rows read':>10s}")
    for b in (int(v) for v in args.batches.split(",")):
        pool = [(x, device_topk(x, k)) for x in (llm_like(b, rng) for _ in range(args.pool))]
        sampler = Sampler(VOCAB, b)
        for name, params in CASES.items():
            full_t, top_t, read = measure_topk(sampler, pool, params, args.iters)
            full, top = statistics.median(full_t) / b, statistics.median(top_t) / b
            print(f"{name:22s} {b:3d} {full:9.1f} {top:10.1f} {full / top:6.2f} {read:10.1%}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--pool", type=int, default=8, help="distinct logits batches cycled through")
    ap.add_argument("--batches", default="1,4,16")
    ap.add_argument("--topk", type=int, default=0, metavar="K", help="compare with sampling a top-K device output")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    if args.topk:
        topk_table(args, rng)
        return
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
