"""The gateway's own cost, measured side by side with a direct daemon client in one run.

Not a test. Starts one calsim daemon (qwen3-30b-a3b preset, time scale 0 so the host is the only
cost) and one gateway on Unix sockets, then runs the same streamed requests (same prompt tokens,
seed and length) two ways, alternating: directly with `AsyncDaemonClient.generate` and through the
gateway's `/v1/completions` with SSE. Reports TTFT and end-to-end p50/p90 for both, the TTFT the
gateway adds, and the gateway process's CPU per streamed token (psutil, user + system).

    .venv/bin/python bench/gateway_bench.py [--requests 40] [--tokens 128] [--concurrency 1]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import orjson
import psutil

from calculet.client import AsyncDaemonClient
from calculet.ops.sim_packages.build import build_sim_package

PROMPT = list(range(1000, 1064))


def start(cmd: list[str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT)


async def wait_ready(http: httpx.AsyncClient, proc: subprocess.Popen[bytes]) -> None:
    for _ in range(1200):
        if proc.poll() is not None:
            raise SystemExit("gateway died")
        try:
            if (await http.get("/ready")).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        await asyncio.sleep(0.1)
    raise SystemExit("gateway not ready")


async def direct(client: AsyncDaemonClient, tokens: int, seed: int) -> tuple[float, float, int]:
    t0 = time.perf_counter()
    gen = await client.generate("qwen", PROMPT, max_tokens=tokens, seed=seed, ignore_eos=True)
    ttft, n = 0.0, 0
    async for chunk in gen.chunks():
        if n == 0:
            ttft = time.perf_counter() - t0
        n += len(chunk.tokens)
    return ttft, time.perf_counter() - t0, n


async def via_gateway(http: httpx.AsyncClient, tokens: int, seed: int) -> tuple[float, float, int]:
    body = {"model": "qwen", "prompt": PROMPT, "max_tokens": tokens, "seed": seed, "stream": True,
            "ignore_eos": True, "stream_options": {"include_usage": True}}  # fmt: skip
    t0 = time.perf_counter()
    ttft, n = 0.0, 0
    async with http.stream("POST", "/v1/completions", json=body) as r:
        async for line in r.aiter_lines():
            if not line.startswith("data: {"):
                continue
            event = orjson.loads(line[6:])
            if event.get("usage"):
                n = event["usage"]["completion_tokens"]
            elif ttft == 0.0:
                ttft = time.perf_counter() - t0
    return ttft, time.perf_counter() - t0, n


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) > 1 else values[0]


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--requests", type=int, default=40)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--loop", default="auto", help="the gateway's event loop: auto, asyncio, uvloop")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gwbench-"))
    build_sim_package("qwen3-30b-a3b", work / "models" / "qwen", decode_batches=(1, 4, 8, 16))
    daemon_sock, gw_sock = work / "d.sock", work / "g.sock"
    daemon = start(
        [sys.executable, "-m", "calculet.daemon.main", "--listen", f"unix:{daemon_sock}",
         "--models-root", str(work / "models"), "--model", "qwen=qwen", "--time-scale", "0"], work / "d.log",
    )  # fmt: skip
    gateway = start(
        [sys.executable, "-m", "calculet.gateway.main", "--listen", f"unix:{gw_sock}", "--daemon",
         f"unix:{daemon_sock}", "--log-level", "WARNING", "--loop", args.loop], work / "g.log",
    )  # fmt: skip
    try:
        transport = httpx.AsyncHTTPTransport(uds=str(gw_sock))
        async with httpx.AsyncClient(transport=transport, base_url="http://g", timeout=120) as http:
            await wait_ready(http, gateway)
            client = AsyncDaemonClient(f"unix:{daemon_sock}")
            for seed in range(3):  # warm-up, not counted
                await direct(client, args.tokens, seed)
                await via_gateway(http, args.tokens, seed)
            results: dict[str, list[tuple[float, float, int]]] = {"direct": [], "gateway": []}
            gw_proc, me = psutil.Process(gateway.pid), psutil.Process()
            gw_cpu = direct_cpu = 0.0
            for start_seed in range(0, args.requests, args.concurrency):
                seeds = range(start_seed, start_seed + args.concurrency)
                before = sum(me.cpu_times()[:2])
                results["direct"] += await asyncio.gather(*(direct(client, args.tokens, s) for s in seeds))
                direct_cpu += sum(me.cpu_times()[:2]) - before
                before = sum(gw_proc.cpu_times()[:2])
                results["gateway"] += await asyncio.gather(*(via_gateway(http, args.tokens, s) for s in seeds))
                gw_cpu += sum(gw_proc.cpu_times()[:2]) - before
            await client.close()
        for name, rows in results.items():
            ttfts, e2es = [r[0] * 1e3 for r in rows], [r[1] * 1e3 for r in rows]
            total = sum(r[2] for r in rows)
            print(f"{name:8s} TTFT p50 {pct(ttfts, 50):7.2f} ms p90 {pct(ttfts, 90):7.2f} ms | "
                  f"E2E p50 {pct(e2es, 50):8.2f} ms p90 {pct(e2es, 90):8.2f} ms | tokens {total}")  # fmt: skip
        added = statistics.median(g[0] - d[0] for g, d in zip(results["gateway"], results["direct"], strict=True))
        tokens = sum(r[2] for r in results["gateway"])
        gw_us, direct_us = gw_cpu * 1e6 / tokens, direct_cpu * 1e6 / tokens
        print(f"gateway adds TTFT p50 {added * 1e3:.2f} ms (paired by seed); per streamed token: gateway process "
              f"{gw_us:.0f} us CPU, a direct AsyncDaemonClient {direct_us:.0f} us")  # fmt: skip
    finally:
        for proc in (gateway, daemon):
            proc.terminate()
            proc.wait(timeout=30)


if __name__ == "__main__":
    asyncio.run(main())
