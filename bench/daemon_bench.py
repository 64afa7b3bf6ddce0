"""Tokens/s of one calsim daemon, serial vs continuous (time scale 0 = host overhead only).

Not a test. Starts a real daemon per policy on a Unix socket, drives it with concurrent
streaming clients, prints throughput and per-request latency percentiles.

    .venv/bin/python bench/daemon_bench.py [--model tiny|qwen] [--clients 16] [--tokens 64]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from calculet.client import DaemonClient
from calculet.ops.sim_packages.build import build_sim_package


def wait_serving(target: str, proc: subprocess.Popen[bytes]) -> None:
    for _ in range(600):
        if proc.poll() is not None:
            raise SystemExit("daemon died")
        try:
            with grpc.insecure_channel(target) as ch:
                resp = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=1)
                if resp.status == health_pb2.HealthCheckResponse.SERVING:
                    return
        except grpc.RpcError:
            pass
        time.sleep(0.1)
    raise SystemExit("daemon not serving")


def drive(target: str, model: str, vocab: int, clients: int, tokens: int, rounds: int) -> tuple[float, list[float]]:
    latencies: list[float] = []
    lock = threading.Lock()
    barrier = threading.Barrier(clients + 1)

    def worker(i: int) -> None:
        with DaemonClient(target) as c:
            barrier.wait()
            for r in range(rounds):
                t0 = time.perf_counter()
                prompt = [(i * 7919 + r * 31 + k) % vocab for k in range(16)]
                n = len(list(c.generate(model, prompt, max_tokens=tokens, temperature=0.0, ignore_eos=True)))
                assert n == tokens
                with lock:
                    latencies.append(time.perf_counter() - t0)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    return clients * rounds * tokens / elapsed, latencies


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="tiny", choices=("tiny", "qwen"))
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--time-scale", default="0", help="0 = host overhead only; 1 = the modelled board speed")
    p.add_argument("--decode-jobs-per-model", default="1", choices=("1", "2"))
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "models"
        if args.model == "tiny":
            build_sim_package("tiny", root / "tiny")
            vocab = 512
        else:
            build_sim_package("qwen3-30b-a3b", root / "qwen", lanes=16, lane_context=2048)
            vocab = 151_936
        for policy in ("serial", "continuous"):
            target = f"unix:{tmp}/{policy}.sock"
            cmd = [sys.executable, "-m", "calculet.daemon.main", "--listen", target, "--models-root", str(root),
                   "--model", f"{args.model}={args.model}", "--time-scale", args.time_scale, "--policy", policy,
                   "--log-level", "WARNING", "--decode-jobs-per-model", args.decode_jobs_per_model]  # fmt: skip
            proc = subprocess.Popen(cmd)
            try:
                wait_serving(target, proc)
                tps, lat = drive(target, args.model, vocab, args.clients, args.tokens, args.rounds)
                q = statistics.quantiles(lat, n=10)
                label = f"{args.model:5s} scale {args.time_scale} {policy:10s}"
                print(f"{label} {tps:8.0f} tokens/s   e2e p50 {q[4]:.3f}s p90 {q[8]:.3f}s", end="")
                print(f"   ({args.clients} clients x {args.rounds} x {args.tokens} tokens)")
            finally:
                proc.terminate()
                proc.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
