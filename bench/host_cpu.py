"""Host CPU per streamed token: daemon, gateway and client, with and without calsim's kernel.

Not a test. Starts one calsim daemon (qwen3-30b-a3b preset, 16 lanes, decode batches 1/4/8/16,
continuous policy, in-flight 2) and one gateway on Unix sockets for each `--time-scales` value, then
streams `--tokens` tokens per request, closed loop, at each `--concurrency` (default 1 and 16), two
ways: directly with `AsyncDaemonClient` and through the gateway's `/v1/completions` (SSE). Each
configuration runs `--repeat` times (after warm-up requests that are not counted); the report gives
the median and the spread (min..max) over the repeats of:

- CPU per streamed token (psutil user + system, microseconds) of the daemon process, the gateway
  process, and this process (the client side: an `AsyncDaemonClient`, or httpx reading SSE);
- the daemon's CPU without calsim's kernel: the kernel (the emulated device's compute, which a real
  board does on the device) is timed here in-process on the same package, rows and batch sizes
  (`time.thread_time`, bf16 conversion included) and subtracted per token;
- the daemon's CPU by thread (their OS names, `daemon/os_threads.py`): the gRPC loop (main
  thread), the engine, the completion thread, calsim's worker (the whole emulated device: its
  clock, copies, kernel and top-k, which a real board does on the board) and the rest; and the
  daemon without calsim's worker;
- TTFT and TPOT p50 (client clocks), throughput, and the device figures from the daemon's Status
  over the run: `step` is the modelled device time per decoded token (H2D + compute + D2H seconds
  on the device clock x time scale, less the prefills' (one request's prefill is measured alone
  first), over the tokens after each request's first; at concurrency 1 that is the decode step, and
  TPOT - step is what the host adds to it), `busy` the
  compute-busy seconds x time scale over the wall window (the fraction of the wall time the
  compute unit was busy: also throughput over the timing-model limit for these same device jobs).

    .venv/bin/python bench/host_cpu.py [--tokens 256] [--time-scales 0,1] [--repeat 3] [--metrics]

At time scale 0 the device takes no wall time, so the host is the only cost (the CPU figures are
cleanest there); at 1 the device is the limit (TPOT, busy ratio). The machine may be shared: CPU
time per token, not wall time, is the figure to compare between runs.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import orjson
import psutil

from calculet.client import AsyncDaemonClient
from calculet.ops.sim_packages.build import build_sim_package
from calculet.v1 import observe_pb2

PROMPT = list(range(1000, 1064))
VOCAB = 151_936


@dataclass
class Run:
    """One measured repeat of one configuration."""

    tokens: int
    requests: int
    wall: float
    cpu: dict[str, float]  # process -> CPU seconds over the run
    ttft: list[float]
    tpot: list[float]
    device: dict[str, float]  # Status differences (device clock seconds) and generated tokens
    threads: dict[str, float]  # the daemon's CPU seconds by thread group (`thread_cpu`)


# The daemon's threads by OS name (daemon/os_threads.py); the main thread runs the gRPC event loop.
THREAD_GROUPS = {"calsim-worker": "calsim", "calculet-engine": "engine", "calculet-comple": "completion"}


def thread_cpu(proc: psutil.Process) -> dict[str, float]:
    """CPU seconds so far of each of the daemon's thread groups: the gRPC loop (main thread), the
    engine, the completion thread, calsim's worker (the emulated device) and the rest (gRPC's core
    threads, observers, ...)."""
    out: dict[str, float] = {}
    for t in proc.threads():
        if t.id == proc.pid:
            group = "loop"
        else:
            try:
                comm = Path(f"/proc/{proc.pid}/task/{t.id}/comm").read_text().strip()
            except OSError:
                continue
            group = THREAD_GROUPS.get(comm, "other")
        out[group] = out.get(group, 0.0) + t.user_time + t.system_time
    return out


def kernel_cpu_per_token(package: Path, batches: tuple[int, ...], rounds: int = 30) -> dict[int, float]:
    """calsim's decode kernel CPU seconds per row at each batch size, timed in this process."""
    import ml_dtypes
    import numpy as np

    from calculet.daemon.calsim.kernel import DecodeRow, make_kernel
    from calculet.daemon.package.manifest import load_manifest

    kernel = make_kernel(load_manifest(package), package, 16, 2048)
    out: dict[int, float] = {}
    for batch in batches:
        times = []
        for r in range(rounds):
            rows = [DecodeRow(lane, r, 1000 + lane + r, r) for lane in range(batch)]
            t0 = time.thread_time()
            np.asarray(kernel.decode(rows), dtype=np.float32).astype(ml_dtypes.bfloat16)
            times.append(time.thread_time() - t0)
        out[batch] = statistics.median(times) / batch
    return out


async def direct(
    client: AsyncDaemonClient, tokens: int, seed: int, temperature: float = 0.0
) -> tuple[float, float, int]:
    t0 = time.perf_counter()
    gen = await client.generate("qwen", PROMPT, max_tokens=tokens, seed=seed, ignore_eos=True, temperature=temperature)
    ttft, n = 0.0, 0
    async for chunk in gen.chunks():
        if n == 0:
            ttft = time.perf_counter() - t0
        n += len(chunk.tokens)
    return ttft, time.perf_counter() - t0, n


async def via_gateway(
    http: httpx.AsyncClient, tokens: int, seed: int, temperature: float = 0.0
) -> tuple[float, float, int]:
    body = {"model": "qwen", "prompt": PROMPT, "max_tokens": tokens, "seed": seed, "stream": True,
            "ignore_eos": True, "stream_options": {"include_usage": True}, "temperature": temperature}  # fmt: skip
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


def device_figures(status: observe_pb2.StatusResponse) -> dict[str, float]:
    u = status.utilization
    return {"busy": u.busy_seconds, "copies_compute": u.h2d_seconds + u.compute_seconds + u.d2h_seconds,
            "tokens": float(u.generated_tokens)}  # fmt: skip


OneRequest = Callable[[int], Awaitable[tuple[float, float, int]]]


async def measure(
    one: OneRequest, concurrency: int, requests: int, procs: dict[str, psutil.Process], status: AsyncDaemonClient
) -> Run:
    """Closed loop: `concurrency` workers run `requests` requests in all; CPU and Status around it."""
    seeds = iter(range(requests))
    rows: list[tuple[float, float, int]] = []

    async def worker() -> None:
        for seed in seeds:
            rows.append(await one(seed))

    before_dev = device_figures(await status.status())
    before = {name: sum(p.cpu_times()[:2]) for name, p in procs.items()}
    threads_before = thread_cpu(procs["daemon"])
    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - t0
    cpu = {name: sum(p.cpu_times()[:2]) - before[name] for name, p in procs.items()}
    threads = {k: v - threads_before.get(k, 0.0) for k, v in thread_cpu(procs["daemon"]).items()}
    after_dev = device_figures(await status.status())
    device = {k: after_dev[k] - before_dev[k] for k in after_dev}
    tokens = sum(r[2] for r in rows)
    tpot = [(e2e - ttft) / (n - 1) for ttft, e2e, n in rows if n > 1]
    return Run(tokens, len(rows), wall, cpu, [r[0] for r in rows], tpot, device, threads)


def spread(values: list[float], fmt: str = "{:.0f}") -> str:
    med = statistics.median(values)
    return f"{fmt.format(med)} ({fmt.format(min(values))}..{fmt.format(max(values))})"


async def prefill_device_s(client: AsyncDaemonClient) -> float:
    """Device-clock H2D + compute + D2H seconds of one request's prefill (a one-token request: the
    prefill job alone; every measured request has the same prompt)."""
    before = device_figures(await client.status())
    await direct(client, 1, 0)
    after = device_figures(await client.status())
    return after["copies_compute"] - before["copies_compute"]


def report(label: str, runs: list[Run], scale: float, kernel_s: float, prefill_s: float) -> None:
    per_tok = {name: [r.cpu[name] * 1e6 / r.tokens for r in runs] for name in runs[0].cpu}
    no_kernel = [d - kernel_s * 1e6 for d in per_tok["daemon"]]
    host = [d + g for d, g in zip(no_kernel, per_tok["gateway"], strict=True)]
    ttft = [statistics.median(r.ttft) * 1e3 for r in runs]
    tpot = [statistics.median(r.tpot) * 1e3 for r in runs]
    decode = [(r.device["copies_compute"] - prefill_s * r.requests) * scale * 1e3 for r in runs]
    step = [d / (r.tokens - r.requests) for d, r in zip(decode, runs, strict=True)]
    busy = [r.device["busy"] * scale / r.wall for r in runs]
    tps = [r.tokens / r.wall for r in runs]
    print(f"{label}  tokens/run {runs[0].tokens}")
    print(f"  CPU us/token  daemon {spread(per_tok['daemon'])}  daemon w/o kernel {spread(no_kernel)}"
          f"  (kernel {kernel_s * 1e6:.0f})  gateway {spread(per_tok['gateway'])}"
          f"  client {spread(per_tok['client'])}  daemon w/o kernel + gateway {spread(host)}")  # fmt: skip
    line = f"  TTFT p50 ms {spread(ttft, '{:.2f}')}  TPOT p50 ms {spread(tpot, '{:.2f}')}  tokens/s {spread(tps)}"
    if scale > 0:
        minus = [t - s for t, s in zip(tpot, step, strict=True)]
        line += f"  device step/token ms {spread(step, '{:.2f}')}  TPOT-step ms {spread(minus, '{:.2f}')}"
        line += f"  busy {spread(busy, '{:.3f}')}"
    print(line)
    groups = ("loop", "engine", "completion", "calsim", "other")
    by_thread = {g: [r.threads.get(g, 0.0) * 1e6 / r.tokens for r in runs] for g in groups}
    no_calsim = [d - c for d, c in zip(per_tok["daemon"], by_thread["calsim"], strict=True)]
    print("  daemon CPU us/token by thread  " + "  ".join(f"{g} {spread(by_thread[g])}" for g in groups)
          + f"  daemon w/o calsim's worker {spread(no_calsim)}", flush=True)  # fmt: skip


async def run_scale(work: Path, scale: str, args: argparse.Namespace, kernel: dict[int, float]) -> None:
    sock, gw_sock = work / f"d{scale}.sock", work / f"g{scale}.sock"
    dcmd = [sys.executable, "-m", "calculet.daemon.main", "--listen", f"unix:{sock}", "--models-root",
            str(work / "models"), "--model", "qwen=qwen", "--time-scale", scale, "--log-level", "WARNING",
            "--max-inflight", "2", "--decode-jobs-per-model", args.decode_jobs]  # fmt: skip
    if args.metrics:
        dcmd += ["--metrics-listen", "127.0.0.1:0"]
    gcmd = [sys.executable, "-m", "calculet.gateway.main", "--listen", f"unix:{gw_sock}", "--daemon",
            f"unix:{sock}", "--log-level", "WARNING"]  # fmt: skip
    daemon = subprocess.Popen(dcmd, stdout=(work / "d.log").open("ab"), stderr=subprocess.STDOUT)
    gateway = subprocess.Popen(gcmd, stdout=(work / "g.log").open("ab"), stderr=subprocess.STDOUT)
    try:
        transport = httpx.AsyncHTTPTransport(uds=str(gw_sock))
        async with (
            httpx.AsyncClient(transport=transport, base_url="http://g", timeout=600) as http,
            AsyncDaemonClient(f"unix:{sock}") as client,
        ):
            await wait_ready(http, work, gateway, daemon)
            procs = {"daemon": psutil.Process(daemon.pid), "gateway": psutil.Process(gateway.pid),
                     "client": psutil.Process()}  # fmt: skip
            paths: dict[str, OneRequest] = {
                "direct": lambda seed: direct(client, args.tokens, seed, args.temperature),
                "gateway": lambda seed: via_gateway(http, args.tokens, seed, args.temperature),
            }
            prefill_s = await prefill_device_s(client)
            for concurrency in args.concurrency:
                for name, one in paths.items():
                    await measure(one, concurrency, concurrency, procs, client)  # warm-up, not counted
                    runs = [
                        await measure(one, concurrency, concurrency * args.rounds, procs, client)
                        for _ in range(args.repeat)
                    ]
                    label = f"scale {scale} c={concurrency:<2d} {name:7s}"
                    kernel_s = kernel[min(b for b in kernel if b >= concurrency)]
                    report(label, runs, float(scale), kernel_s, prefill_s)
    finally:
        for proc in (gateway, daemon):
            proc.terminate()
            proc.wait(timeout=30)


async def wait_ready(http: httpx.AsyncClient, work: Path, *procs: subprocess.Popen[bytes]) -> None:
    for _ in range(1200):
        if any(p.poll() is not None for p in procs):
            logs = "\n".join((work / name).read_text()[-2000:] for name in ("d.log", "g.log"))
            raise SystemExit(f"daemon or gateway died:\n{logs}")
        try:
            if (await http.get("/ready")).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        await asyncio.sleep(0.1)
    raise SystemExit("gateway not ready")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=256, help="output tokens per request")
    p.add_argument("--time-scales", default="0,1", help="comma-separated calsim --time-scale values")
    p.add_argument("--concurrency", default="1,16", help="comma-separated closed-loop concurrencies (<= 16)")
    p.add_argument("--rounds", type=int, default=2, help="requests per worker in one measured repeat")
    p.add_argument("--repeat", type=int, default=3, help="measured repeats per configuration")
    p.add_argument("--decode-jobs", default="2", choices=("1", "2"), help="--decode-jobs-per-model")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (sampling is measured apart)")
    p.add_argument("--metrics", action="store_true", help="daemon with --metrics-listen (the observer hub on)")
    args = p.parse_args()
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    with tempfile.TemporaryDirectory(prefix="hostcpu-") as tmp:
        work = Path(tmp)
        package = build_sim_package("qwen3-30b-a3b", work / "models" / "qwen", decode_batches=(1, 4, 8, 16))
        kernel = kernel_cpu_per_token(package, (1, 4, 8, 16))
        print("calsim kernel CPU us/row by batch: " + ", ".join(f"{b}: {s * 1e6:.0f}" for b, s in kernel.items()))
        for scale in args.time_scales.split(","):
            asyncio.run(run_scale(work, scale, args, kernel))


if __name__ == "__main__":
    main()
