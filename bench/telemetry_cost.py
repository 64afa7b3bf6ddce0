"""CPU cost of metrics and tracing per streamed token, on and off, daemon and gateway.

Not a test. For each setting (off; metrics; metrics + tracing) it starts one calsim daemon (tiny,
time scale 0, so the host is the only cost) and a gateway on Unix sockets, runs the same streamed
requests through the gateway with `calctl bench`, and reports the daemon's and the gateway's CPU
time (user + system, psutil) per streamed token. A scrape of each /metrics endpoint happens once
at the end of a run, as a Prometheus server would every 15 s (its cost is reported apart).
Tracing uses the SDK's console exporter into the process log (JSON formatting included: an OTLP
exporter would serialise protobuf instead), every request traced, or 1 % sampled at the gateway.

    .venv/bin/python bench/telemetry_cost.py [--requests 60] [--tokens 64] [--concurrency 8] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil

from calculet.ops.sim_packages.build import build_sim_package

TRACED = {"OTEL_TRACES_EXPORTER": "console"}
SAMPLED_1PCT = {**TRACED, "OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.01"}
SETTINGS = {
    "off": ({}, False),
    "metrics": ({}, True),
    "metrics+tracing": (TRACED, True),
    "metrics+tracing 1%": (SAMPLED_1PCT, True),
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu(proc: subprocess.Popen[bytes]) -> float:
    t = psutil.Process(proc.pid).cpu_times()
    return float(t.user + t.system)


def wait_ready(gateway_sock: Path, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit("gateway died")
        try:
            with httpx.Client(transport=httpx.HTTPTransport(uds=str(gateway_sock))) as http:
                if http.get("http://g/ready").status_code == 200:
                    return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise SystemExit("gateway not ready")


def run(work: Path, models: Path, setting: str, args: argparse.Namespace) -> dict[str, float]:
    extra_env, metrics = SETTINGS[setting]
    env = {**os.environ, **extra_env, "OTEL_BSP_SCHEDULE_DELAY": "1000"}
    d_sock, g_sock = work / "d.sock", work / "g.sock"
    port = free_port()
    d_cmd = [sys.executable, "-m", "calculet.daemon.main", "--listen", f"unix:{d_sock}", "--models-root",
             str(models), "--model", "tiny=tiny", "--time-scale", "0", "--runtime-dir", str(work)]  # fmt: skip
    if metrics:
        d_cmd += ["--metrics-listen", f"127.0.0.1:{port}"]
    g_cmd = [sys.executable, "-m", "calculet.gateway.main", "--listen", f"unix:{g_sock}", "--daemon", f"unix:{d_sock}"]
    daemon = subprocess.Popen(d_cmd, stdout=(work / "d.log").open("wb"), stderr=subprocess.STDOUT, env=env)
    gateway = subprocess.Popen(g_cmd, stdout=(work / "g.log").open("wb"), stderr=subprocess.STDOUT, env=env)
    try:
        wait_ready(g_sock, gateway)
        bench = [sys.executable, "-m", "calculet.ops.calctl", "bench", "--gateway", f"unix:{g_sock}", "--model",
                 "tiny", "--requests", str(args.requests), "--concurrency", str(args.concurrency), "--prompt-len",
                 "32", "--output-len", str(args.tokens), "--ignore-eos", "--warmup", "4", "--no-progress",
                 "--json", str(work / "bench.json")]  # fmt: skip
        warm = [*bench[:-2], "--requests", "8", "--json", str(work / "warm.json")]
        subprocess.run(warm, check=True, capture_output=True)
        d0, g0 = cpu(daemon), cpu(gateway)
        subprocess.run(bench, check=True, capture_output=True)
        d1, g1 = cpu(daemon), cpu(gateway)
        tokens = json.loads((work / "bench.json").read_text())["counts"]["output_tokens"]
        scrape = 0.0
        if metrics:
            with httpx.Client() as http:
                http.get(f"http://127.0.0.1:{port}/metrics")  # warm
                s0 = cpu(daemon)
                http.get(f"http://127.0.0.1:{port}/metrics")
                scrape = cpu(daemon) - s0
        return {
            "daemon_us": (d1 - d0) / tokens * 1e6,
            "gateway_us": (g1 - g0) / tokens * 1e6,
            "scrape_ms": scrape * 1e3,
        }
    finally:
        for p in (gateway, daemon):
            p.terminate()
            p.wait(30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=60)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        build_sim_package("tiny", root / "models" / "tiny")
        results: dict[str, list[dict[str, float]]] = {s: [] for s in SETTINGS}
        for i in range(args.repeat):  # interleaved, so a busy moment hits every setting alike
            for setting in SETTINGS:
                work = root / f"{setting}-{i}"
                work.mkdir()
                results[setting].append(run(work, root / "models", setting, args))
    print(f"CPU per streamed token (us), median of {args.repeat}; concurrency {args.concurrency}, {args.tokens} tokens")
    print(f"{'setting':18} {'daemon':>8} {'gateway':>8} {'total':>8}  scrape ms")
    for setting, runs in results.items():
        d = statistics.median(r["daemon_us"] for r in runs)
        g = statistics.median(r["gateway_us"] for r in runs)
        s = statistics.median(r["scrape_ms"] for r in runs)
        print(f"{setting:18} {d:8.0f} {g:8.0f} {d + g:8.0f}  {s:.1f}")


if __name__ == "__main__":
    main()
