"""`calctl bench`: a serving benchmark with exact definitions (docs/benchmarking.md), in the manner of
vLLM's serving benchmark, reimplemented in small modules.

Data flow:

    workload (synthetic lengths or a JSONL file) -> BenchRequest list (warm-up first, then measured)
    -> schedule (closed loop: N in flight; open loop: gamma inter-arrivals at a rate)
    -> backend.send (gateway: OpenAI /v1/completions SSE over httpx; daemon: AsyncDaemonClient)
    -> RequestRecord per request (start, every chunk's arrival and token count, end, error)
    -> latency (TTFT, TPOT, ITL, E2E per request) -> summary (percentiles, throughput, goodput)
    + device_stats (the daemons' Status utilisation before and after the run, diffed)
    -> report (the JSON schema), table (rich), plot (matplotlib, optional).

`--workload multiturn` (conversations through the gateway's chat API, issue 19) has its own
workload, backend and per-turn figures in `multiturn/` and reuses the runner's framing, the summary,
the device figures and the report; `suite/` is `calctl bench suite` (the matrix, and the multi-turn
comparison).

Everything runs on one asyncio loop; times are `time.perf_counter()` seconds. Only `wire_views`
touches protobuf; the backends and the runner never do.
"""
