"""A small client's time to first token while another client sends huge bodies (issue 30, item 1).

Not a test. Against a running gateway (`calctl up`), it measures the TTFT of a 4-token streamed
chat request when the gateway is idle, then again while a hostile client sends chat bodies of the
given sizes in a loop (one message of that many characters, with a Content-Length; `--chunked`
sends them without one, so the gateway learns the size only by reading) from a process of its own.
It samples the gateway's
RSS (psutil, by the pid that listens on the port) throughout and reports, per size: the hostile
answers' statuses and times, the small requests' TTFT p50/max against idle, and the RSS peak.

    .venv/bin/python bench/hostile_bodies.py --url http://127.0.0.1:8000 --model qwen3-30b-a3b \
        [--sizes 10M,100M] [--seconds 20] [--chunked]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections import Counter
from collections.abc import AsyncIterator
from multiprocessing import Event, Process, Queue
from multiprocessing.synchronize import Event as EventType

import httpx
import orjson
import psutil

SMALL = {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 1, "stream": True, "seed": 1}


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(text[:-1]) * units[text[-1]]) if text[-1] in units else int(text)


def gateway_process(port: int) -> psutil.Process:
    for conn in psutil.net_connections("tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr.port == port and conn.pid:
            return psutil.Process(conn.pid)
    raise SystemExit(f"no process listens on port {port}")


async def small_ttft(http: httpx.AsyncClient, model: str) -> float:
    t0 = time.perf_counter()
    async with http.stream("POST", "/v1/chat/completions", json=SMALL | {"model": model}) as resp:
        resp.raise_for_status()
        async for line in resp.aiter_lines():
            if line.startswith("data:"):
                return time.perf_counter() - t0
    raise RuntimeError("no event")


def hostile_body(model: str, size: int) -> bytes:
    return orjson.dumps({"model": model, "messages": [{"role": "user", "content": "x" * size}], "max_tokens": 1})


async def chunks(body: bytes) -> AsyncIterator[bytes]:
    for i in range(0, len(body), 1 << 20):
        yield body[i : i + (1 << 20)]


async def hostile_loop(url: str, body: bytes, chunked: bool, stop: EventType) -> list[tuple[str, float]]:
    out: list[tuple[str, float]] = []
    async with httpx.AsyncClient(base_url=url, timeout=300) as http:
        while not stop.is_set():
            t0 = time.perf_counter()
            try:
                content = chunks(body) if chunked else body
                headers = {"content-type": "application/json"}
                resp = await http.post("/v1/chat/completions", content=content, headers=headers)
                outcome = str(resp.status_code)
            except httpx.HTTPError as err:
                outcome = type(err).__name__
            out.append((outcome, time.perf_counter() - t0))
    return out


def hostile_process(url: str, model: str, size: int, chunked: bool, stop: EventType, results: Queue) -> None:
    """The hostile client, in a process of its own: its sending must not slow the measuring client."""
    results.put(asyncio.run(hostile_loop(url, hostile_body(model, size), chunked, stop)))


async def sample_rss(proc: psutil.Process, stop: asyncio.Event, peak: list[int]) -> None:
    while not stop.is_set():
        rss = sum(p.memory_info().rss for p in [proc, *proc.children(recursive=True)])
        peak[0] = max(peak[0], rss)
        await asyncio.sleep(0.05)


async def ttfts(http: httpx.AsyncClient, model: str, seconds: float) -> list[float]:
    out: list[float] = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        out.append(await small_ttft(http, model))
        await asyncio.sleep(0.2)
    return out


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--model", default="qwen3-30b-a3b")
    ap.add_argument("--sizes", default="10M,100M")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--chunked", action="store_true")
    args = ap.parse_args()
    proc = gateway_process(httpx.URL(args.url).port or 80)
    async with httpx.AsyncClient(base_url=args.url, timeout=300) as http:
        await ttfts(http, args.model, 2.0)  # warm-up
        idle = await ttfts(http, args.model, args.seconds / 2)
        base_rss = proc.memory_info().rss
        print(f"idle: TTFT p50 {statistics.median(idle) * 1e3:.0f} ms max {max(idle) * 1e3:.0f} ms "
              f"({len(idle)} requests), gateway RSS {base_rss / 2**20:.0f} MiB")  # fmt: skip
        for size in map(parse_size, args.sizes.split(",")):
            stop, sampling, peak, results = Event(), asyncio.Event(), [base_rss], Queue()
            hostile = Process(target=hostile_process, args=(args.url, args.model, size, args.chunked, stop, results))
            hostile.start()
            sampler = asyncio.create_task(sample_rss(proc, sampling, peak))
            loaded = await ttfts(http, args.model, args.seconds)
            stop.set()
            sampling.set()
            await sampler
            outcomes = await asyncio.to_thread(results.get)
            hostile.join()
            statuses = Counter(s for s, _ in outcomes)
            times = [t for _, t in outcomes]
            print(f"{size / 2**20:.0f} MiB bodies{' (chunked)' if args.chunked else ''}: {dict(statuses)}, "
                  f"answered in p50 {statistics.median(times) * 1e3:.0f} ms; small TTFT p50 "
                  f"{statistics.median(loaded) * 1e3:.0f} ms max {max(loaded) * 1e3:.0f} ms "
                  f"({statistics.median(loaded) / statistics.median(idle):.2f}x idle p50, {len(loaded)} requests); "
                  f"gateway RSS peak {peak[0] / 2**20:.0f} MiB, now {proc.memory_info().rss / 2**20:.0f} MiB"
            )  # fmt: skip


if __name__ == "__main__":
    asyncio.run(main())
