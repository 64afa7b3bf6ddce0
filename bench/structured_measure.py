"""Structured outputs, enforced tool calls and bounded thinking, measured end to end (issue 31,
deliverable 8): validity, cost at saturation and at concurrency 1, compile, failover.

Not a test. Builds (or reuses) the calsim qwen3-30b-a3b package under `--dir/models`, starts a local
fleet per part (`ops.fleet.LocalFleet`: calsim daemons on Unix sockets, the gateway on loopback) and
talks HTTP to the gateway. Parts (`--parts`, comma-separated, in this order):

- validity (time scale 0): `--requests` chat requests with `response_format` json_schema over random
  bounded schemas (enums, strings with maxLength, bounded integers and numbers, arrays with maxItems,
  nested objects, optional fields), with thinking off (`chat_template_kwargs.enable_thinking: false`)
  and with `thinking_token_budget: 32`; the same count with `tool_choice: "required"` and with a
  named function (the calls' arguments against the tool's `parameters`); `/v1/responses` with
  `text.format` json_schema; and a few unbounded schemas (a free string; an object without
  `additionalProperties: false`). Reports the share that parse and validate (`jsonschema`) and the
  finish reasons.
- saturation (time scale 1): `--concurrency` closed-loop streams for `--duration` s each,
  unconstrained (`ignore_eos`) against constrained (a schema whose bounded items repeat past
  max_tokens, so both run exactly max_tokens tokens), alternating A/B/A/B; output tokens/s and the
  ratio.
- tpot (time scale 1): one stream at a time, TPOT p50 unconstrained against constrained.
- compile (time scale 1): TTFT of the first constrained request on a fresh board (the llguidance
  tokenizer build), then of a new schema against the same schema again, against unconstrained.
- failover (time scale 1, 2 boards): a constrained stream whose board is SIGKILLed mid-object;
  its text against the undisturbed run with the same seed, and validation.
- cpu (time scale 0): the daemon process's CPU per streamed token, unconstrained against
  constrained, at `--concurrency` streams (`--cpu-requests` a window, `--rounds` pairs).

    .venv/bin/python bench/structured_measure.py [--parts validity,saturation,tpot,compile,failover,cpu]
        [--dir /tmp/measure-structured] [--port 18740] [--requests 200] [--duration 30]
        [--concurrency 16] [--tokens 128]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import random
import signal
import statistics
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import psutil

from calculet.client import AsyncDaemonClient, Constraint, SamplingParams, ThinkingBudget
from calculet.ops.bench.structured.schemas import object_schema, parsed, response_format, tool_set
from calculet.ops.bench.structured.schemas import validates as schema_validates
from calculet.ops.fleet import FleetConfig, LocalFleet
from calculet.ops.sim_packages.build import build_sim_package

PRESET = "qwen3-30b-a3b"
MODEL = "qwen"
NO_THINK = {"enable_thinking": False}
ROWS: list[tuple[str, str]] = []  # (measure, value) for the summary table

Json = dict[str, Any]


def say(text: str) -> None:
    print(text, flush=True)


def row(measure: str, value: str) -> None:
    ROWS.append((measure, value))
    say(f"  {measure}: {value}")


# ---------------------------------------------------------------------------------------- schemas


def item_schema() -> Json:
    """One bounded item; an array of 64 of them never completes within max_tokens."""
    return {
        "type": "object",
        "properties": {
            "id": {"type": "integer", "minimum": 0, "maximum": 9999},
            "name": {"type": "string", "maxLength": 12},
            "tag": {"enum": ["red", "green", "blue"]},
        },
        "required": ["id", "name", "tag"],
        "additionalProperties": False,
    }


LONG_SCHEMA: Json = {
    "type": "object",
    "properties": {"items": {"type": "array", "items": item_schema(), "minItems": 64, "maxItems": 64}},
    "required": ["items"],
    "additionalProperties": False,
}
UNBOUNDED = {
    "free string": {"type": "object", "properties": {"s": {"type": "string"}}, "required": ["s"]},
    "open object": {"type": "object", "properties": {"a": {"enum": ["x", "y"]}}, "required": ["a"]},
}


def validates(text: str | None, schema: Json) -> bool:
    ok, value = parsed(text)
    return ok and schema_validates(value, schema)


# ---------------------------------------------------------------------------------------- fleet


@contextmanager
def fleet(args: argparse.Namespace, part: str, boards: int, time_scale: float) -> Iterator[LocalFleet]:
    models = Path(args.dir) / "models"
    if not (models / PRESET / "calculet-package.json").exists():
        say(f"== building the calsim {PRESET} package under {models}")
        build_sim_package(PRESET, models / PRESET, force=True)
    config = FleetConfig(
        workdir=Path(args.dir) / part, boards=boards, model=MODEL, package=PRESET, models_root=models,
        port=args.port, time_scale=time_scale, gateway_args=("--log-level", "WARNING"),
    )  # fmt: skip
    local = LocalFleet(config)
    say(f"== {part}: {boards} board(s), time scale {time_scale:g}, gateway {local.base_url}")
    try:
        local.start(timeout_s=300)
        local.wait_ready(timeout_s=300)
        yield local
    finally:
        local.stop()


def http_client(local: LocalFleet, connections: int = 32) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    return httpx.AsyncClient(base_url=local.base_url, timeout=600, limits=limits)


async def post(http: httpx.AsyncClient, path: str, body: Json) -> Json:
    r = await http.post(path, json=body)
    if r.status_code != 200:
        raise RuntimeError(f"{path}: HTTP {r.status_code}: {r.text[:300]}")
    return r.json()


@dataclass
class Stream:
    """One streamed chat answer: TTFT (first delta with content), end, tokens, text."""

    ttft: float = 0.0
    e2e: float = 0.0
    tokens: int = 0
    text: str = ""
    finish: str = ""
    deltas: list[float] = field(default_factory=list)


async def stream_chat(
    http: httpx.AsyncClient, body: Json, on_delta: Callable[[int], Awaitable[None]] | None = None
) -> Stream:
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    out, parts = Stream(), []
    t0 = time.perf_counter()
    async with http.stream("POST", "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread())[:300]!r}")
        async for line in r.aiter_lines():
            if not line.startswith("data: {"):
                continue
            event = orjson.loads(line[6:])
            if event.get("usage"):
                out.tokens = event["usage"]["completion_tokens"]
            for choice in event.get("choices") or ():
                delta = choice.get("delta") or {}
                piece = delta.get("content") or ""
                if piece or delta.get("reasoning_content") or delta.get("tool_calls"):
                    now = time.perf_counter() - t0
                    out.ttft = out.ttft or now
                    out.deltas.append(now)
                    parts.append(piece)
                    if on_delta is not None:
                        await on_delta(len(out.deltas))
                if choice.get("finish_reason"):
                    out.finish = choice["finish_reason"]
    out.e2e, out.text = time.perf_counter() - t0, "".join(parts)
    return out


def pct(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100)[q - 1] if len(values) > 1 else values[0]


async def bounded(n: int, concurrency: int, job: Callable[[int], Awaitable[Any]]) -> list[Any]:
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int) -> Any:
        async with gate:
            return await job(i)

    return await asyncio.gather(*(one(i) for i in range(n)))


def share(ok: int, n: int) -> str:
    return f"{ok}/{n} ({100.0 * ok / n:.1f}%)"


# ---------------------------------------------------------------------------------------- validity


async def token_id(http: httpx.AsyncClient, text: str) -> int:
    ids = (await post(http, "/tokenize", {"model": MODEL, "prompt": text}))["tokens"]
    if len(ids) != 1:
        raise RuntimeError(f"{text!r} is not one token: {ids}")
    return ids[0]


async def opened_block(http: httpx.AsyncClient, local: LocalFleet, schemas: list[Json], conc: int) -> None:
    """The chat path's think block opens only if the model's first token is `<think>` (Qwen3's
    template does not open it), which calsim's random model almost never draws. So here the prompt
    opens it (the chat prompt with thinking on, plus `<think>`), sent straight to the board with the
    schema and budget 32: 32 free tokens, the forced close, then the JSON (detokenized by the gateway)."""
    open_id, close_id = await token_id(http, "<think>"), await token_id(http, "</think>")
    client = AsyncDaemonClient(local.targets[0])

    async def one(i: int) -> tuple[bool, int, bool]:
        msgs = [{"role": "user", "content": f"Describe item {i} as JSON."}]
        prompt = (await post(http, "/tokenize", {"model": MODEL, "messages": msgs}))["tokens"] + [open_id]
        budget = ThinkingBudget(32, open_token_id=open_id, close_token_id=close_id)
        sampling = SamplingParams(seed=i, constraint=Constraint.of_json_schema(schemas[i]), thinking=budget)
        gen = await client.generate(MODEL, prompt, max_tokens=512, sampling=sampling)
        tokens = [t async for t in gen]
        if close_id not in tokens:
            return False, len(tokens), False
        cut = tokens.index(close_id)
        text = (await post(http, "/detokenize", {"model": MODEL, "tokens": tokens[cut + 1 :]}))["prompt"]
        return validates(text.strip(), schemas[i]), cut, gen.final is not None and gen.final.reason.value == "stop"

    res = await bounded(len(schemas), conc, one)
    await client.close()
    thinking = collections.Counter(r[1] for r in res)
    row("valid, block opened by the prompt, budget 32 (daemon direct)",
        f"{share(sum(r[0] for r in res), len(res))}; finish stop {sum(r[2] for r in res)}; "
        f"thinking tokens before the close: {dict(sorted(thinking.items()))}")  # fmt: skip


async def validity(args: argparse.Namespace, http: httpx.AsyncClient, local: LocalFleet) -> None:
    n, conc, max_tokens = args.requests, 4, 512
    schemas = [object_schema(random.Random(1000 + i)) for i in range(n)]

    def chat_body(i: int, extra: Json) -> Json:
        return {"model": MODEL, "seed": i, "max_tokens": max_tokens,
                "messages": [{"role": "user", "content": f"Describe item {i} as JSON."}], **extra}  # fmt: skip

    for label, extra in (
        ("json_schema, thinking off", {"chat_template_kwargs": NO_THINK}),
        ("json_schema, thinking_token_budget 32", {"thinking_token_budget": 32}),
    ):

        async def one(i: int, extra: Json = extra) -> tuple[bool, str, bool, int]:
            answer = await post(http, "/v1/chat/completions",
                                chat_body(i, {**extra, "response_format": response_format(schemas[i])}))  # fmt: skip
            choice = answer["choices"][0]
            msg = choice["message"]
            thought = bool(msg.get("reasoning_content"))
            ok = validates(msg.get("content"), schemas[i])
            return ok, choice["finish_reason"], thought, answer["usage"]["completion_tokens"]

        t0 = time.perf_counter()
        res = await bounded(n, conc, one)
        finishes = collections.Counter(r[1] for r in res)
        tokens = [r[3] for r in res]
        row(f"valid, {label}", f"{share(sum(r[0] for r in res), n)}; finish {dict(finishes)}; "
            f"tokens p50 {statistics.median(tokens):.0f} max {max(tokens)}; with reasoning {sum(r[2] for r in res)}; "
            f"{time.perf_counter() - t0:.0f} s")  # fmt: skip
        bad = [i for i, r in enumerate(res) if not r[0]]
        if bad:
            say(f"    invalid (first 3): {[(i, res[i][1], json.dumps(schemas[i])[:200]) for i in bad[:3]]}")

    def tools_for(i: int) -> list[Json]:
        return tool_set(random.Random(5000 + i))

    for label in ("required", "named"):

        async def call(i: int, label: str = label) -> tuple[bool, str, int]:
            tools = tools_for(i)
            named = tools[i % len(tools)]["function"]["name"]
            choice_field: Any = "required" if label == "required" else {"type": "function", "function": {"name": named}}
            answer = await post(http, "/v1/chat/completions", chat_body(i, {
                "tools": tools, "tool_choice": choice_field, "chat_template_kwargs": NO_THINK}))  # fmt: skip
            choice = answer["choices"][0]
            calls = choice["message"].get("tool_calls") or []
            params = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
            ok = bool(calls) and all(
                c["function"]["name"] in params
                and (label == "required" or c["function"]["name"] == named)
                and validates(c["function"]["arguments"], params[c["function"]["name"]])
                for c in calls
            )
            return ok, choice["finish_reason"], len(calls)

        res = await bounded(n, conc, call)
        finishes = collections.Counter(r[1] for r in res)
        row(f"valid, tool_choice {label}", f"{share(sum(r[0] for r in res), n)}; finish {dict(finishes)}; "
            f"calls per answer max {max(r[2] for r in res)}")  # fmt: skip

    async def responses(i: int) -> tuple[bool, str]:
        fmt = {"type": "json_schema", "name": "out", "schema": schemas[i], "strict": True}
        body = {"model": MODEL, "input": f"Describe item {i} as JSON.", "max_output_tokens": max_tokens, "seed": i,
                "chat_template_kwargs": NO_THINK, "text": {"format": fmt}}  # fmt: skip
        answer = await post(http, "/v1/responses", body)
        text = "".join(
            part.get("text", "") for item in answer["output"] if item["type"] == "message" for part in item["content"]
        )
        return validates(text, schemas[i]), answer["status"]

    res = await bounded(n, conc, responses)
    row("valid, /v1/responses text.format json_schema",
        f"{share(sum(r[0] for r in res), n)}; status {dict(collections.Counter(r[1] for r in res))}")  # fmt: skip
    await opened_block(http, local, schemas, conc)

    for label, schema in UNBOUNDED.items():

        async def loose(i: int, schema: Json = schema) -> tuple[bool, str, int]:
            extra = {"max_tokens": 128, "chat_template_kwargs": NO_THINK, "response_format": response_format(schema)}
            answer = await post(http, "/v1/chat/completions", chat_body(i, extra))
            choice = answer["choices"][0]
            return (
                validates(choice["message"]["content"], schema),
                choice["finish_reason"],
                answer["usage"]["completion_tokens"],
            )

        res = await bounded(20, conc, loose)
        row(f"unbounded ({label}), max_tokens 128", f"valid {share(sum(r[0] for r in res), 20)}; "
            f"finish {dict(collections.Counter(r[1] for r in res))}; tokens max {max(r[2] for r in res)}")  # fmt: skip


# ---------------------------------------------------------------------------------------- cost


def cost_body(i: int, tokens: int, constrained: bool) -> Json:
    body: Json = {"model": MODEL, "seed": i, "max_tokens": tokens, "chat_template_kwargs": NO_THINK,
                  "messages": [{"role": "user", "content": f"List the items of batch {i % 8}."}]}  # fmt: skip
    if constrained:
        body["response_format"] = response_format(LONG_SCHEMA)
    else:
        body["ignore_eos"] = True
    return body


async def saturation(args: argparse.Namespace, http: httpx.AsyncClient) -> None:
    tokens, conc = args.tokens, args.concurrency
    await bounded(conc, conc, lambda i: stream_chat(http, cost_body(i, tokens, True)))  # warm-up and compile
    await bounded(conc, conc, lambda i: stream_chat(http, cost_body(i, tokens, False)))
    totals: dict[bool, list[float]] = {False: [], True: []}
    decode: dict[bool, list[float]] = {False: [], True: []}
    for rnd in range(args.rounds):
        for constrained in (False, True):
            done: list[Stream] = []
            end = time.perf_counter() + args.duration
            t0 = time.perf_counter()

            async def worker(
                w: int, constrained: bool = constrained, end: float = end, done: list[Stream] = done
            ) -> None:
                i = w
                while time.perf_counter() < end:
                    done.append(await stream_chat(http, cost_body(i, tokens, constrained)))
                    i += conc

            await asyncio.gather(*(worker(w) for w in range(conc)))
            wall = time.perf_counter() - t0
            n = sum(s.tokens for s in done)
            per_stream = [(s.tokens - 1) / (s.e2e - s.ttft) for s in done if s.tokens > 1 and s.e2e > s.ttft]
            totals[constrained].append(n / wall)
            decode[constrained].append(statistics.median(per_stream))
            lengths = collections.Counter(s.finish for s in done)
            say(f"    round {rnd} {'constrained' if constrained else 'plain      '}: {len(done)} requests, "
                f"{n} tokens in {wall:.1f} s = {n / wall:.1f} tok/s; per-stream decode p50 "
                f"{statistics.median(per_stream):.2f} tok/s; finish {dict(lengths)}")  # fmt: skip
    plain, cons = statistics.mean(totals[False]), statistics.mean(totals[True])
    row(f"saturation {conc} streams: output tok/s plain / constrained", f"{plain:.1f} / {cons:.1f}, "
        f"ratio {cons / plain:.3f} (target >= 0.95)")  # fmt: skip
    dp, dc = statistics.mean(decode[False]), statistics.mean(decode[True])
    row(f"saturation {conc} streams: per-stream decode p50 plain / constrained",
        f"{dp:.2f} / {dc:.2f} tok/s, ratio {dc / dp:.3f}")  # fmt: skip


async def cpu(args: argparse.Namespace, http: httpx.AsyncClient, local: LocalFleet) -> None:
    """The daemon's CPU per token (user + system seconds of its process over a window, over the
    tokens streamed in it), plain against constrained, at `--concurrency` streams, time scale 0.
    calsim's kernel runs in that process too (the emulated device's compute, the same both ways),
    so the difference is what the constraint costs."""
    tokens, conc = args.tokens, args.concurrency
    daemon = psutil.Process(local.daemons[0].pid)
    await bounded(conc, conc, lambda i: stream_chat(http, cost_body(i, tokens, True)))  # warm-up and compile
    await bounded(conc, conc, lambda i: stream_chat(http, cost_body(i, tokens, False)))
    per_token: dict[bool, list[float]] = {False: [], True: []}
    for rnd in range(args.rounds):
        for constrained in (False, True):
            before = daemon.cpu_times()
            done = await bounded(
                args.cpu_requests, conc, lambda i, c=constrained: stream_chat(http, cost_body(i, tokens, c))
            )
            after = daemon.cpu_times()
            n = sum(s.tokens for s in done)
            used = (after.user - before.user) + (after.system - before.system)
            per_token[constrained].append(used / n * 1e6)
            say(f"    round {rnd} {'constrained' if constrained else 'plain      '}: {n} tokens, "
                f"daemon CPU {used:.2f} s = {used / n * 1e6:.0f} us/token")  # fmt: skip
    p, c = statistics.mean(per_token[False]), statistics.mean(per_token[True])
    row(f"daemon CPU per token at {conc} streams, time scale 0: plain / constrained",
        f"{p:.0f} / {c:.0f} us (+{c - p:.0f} us)")  # fmt: skip


async def tpot(args: argparse.Namespace, http: httpx.AsyncClient) -> None:
    tokens = args.tokens
    for i in range(2):
        await stream_chat(http, cost_body(i, tokens, True))
        await stream_chat(http, cost_body(i, tokens, False))
    rates: dict[bool, list[float]] = {False: [], True: []}
    ttfts: dict[bool, list[float]] = {False: [], True: []}
    for i in range(args.tpot_requests):
        for constrained in (False, True):  # alternating, paired by seed
            s = await stream_chat(http, cost_body(100 + i, tokens, constrained))
            rates[constrained].append((s.e2e - s.ttft) * 1e3 / (s.tokens - 1))
            ttfts[constrained].append(s.ttft * 1e3)
    p, c = statistics.median(rates[False]), statistics.median(rates[True])
    row("concurrency 1: TPOT p50 plain / constrained",
        f"{p:.2f} / {c:.2f} ms (+{c - p:.2f} ms; target <= +0.3 ms); p90 {pct(rates[False], 90):.2f} / "
        f"{pct(rates[True], 90):.2f} ms; {args.tpot_requests} requests of {tokens} tokens each")  # fmt: skip
    row(
        "concurrency 1: TTFT p50 plain / constrained (cached schema)",
        f"{statistics.median(ttfts[False]):.1f} / {statistics.median(ttfts[True]):.1f} ms",
    )


# ---------------------------------------------------------------------------------------- compile


async def compile_cost(args: argparse.Namespace, http: httpx.AsyncClient) -> None:
    def body(i: int, schema: Json | None) -> Json:
        b: Json = {"model": MODEL, "seed": i, "max_tokens": 4, "chat_template_kwargs": NO_THINK,
                   "messages": [{"role": "user", "content": "Answer in JSON."}]}  # fmt: skip
        if schema is not None:
            b["response_format"] = response_format(schema)
        return b

    for i in range(3):
        await stream_chat(http, body(i, None))
    first = await stream_chat(http, body(0, object_schema(random.Random(-1))))
    plain, new, again = [], [], []
    for i in range(args.compile_requests):
        schema = object_schema(random.Random(90_000 + i))
        schema["properties"][f"unique_{i}"] = {"enum": [f"v{i}", "w"]}  # never seen before
        plain.append((await stream_chat(http, body(i, None))).ttft * 1e3)
        new.append((await stream_chat(http, body(i, schema))).ttft * 1e3)
        again.append((await stream_chat(http, body(i, schema))).ttft * 1e3)
    row(
        "compile: TTFT of the first constrained request on a fresh board (tokenizer build)",
        f"{first.ttft * 1e3:.0f} ms (plain p50 {statistics.median(plain):.1f} ms)",
    )
    extra = statistics.median(n - a for n, a in zip(new, again, strict=True))
    row("compile: TTFT p50 plain / new schema / same schema again",
        f"{statistics.median(plain):.1f} / {statistics.median(new):.1f} / {statistics.median(again):.1f} ms; "
        f"new - again p50 {extra:+.1f} ms (target <= 50), again - plain p50 "
        f"{statistics.median(a - p for a, p in zip(again, plain, strict=True)):+.1f} ms (target ~0); "
        f"{args.compile_requests} schemas")  # fmt: skip


# ---------------------------------------------------------------------------------------- failover


FAILOVER_SCHEMA: Json = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 24},
        "items": {"type": "array", "items": item_schema(), "minItems": 4, "maxItems": 4},
        "done": {"type": "boolean"},
    },
    "required": ["title", "items", "done"],
    "additionalProperties": False,
}


async def failover(args: argparse.Namespace, http: httpx.AsyncClient, local: LocalFleet) -> None:
    boards = [(d, AsyncDaemonClient(t)) for d, t in zip(local.daemons, local.targets, strict=True)]
    body = {"model": MODEL, "seed": 4242, "max_tokens": 512, "chat_template_kwargs": NO_THINK,
            "messages": [{"role": "user", "content": "Four items, as JSON."}],
            "response_format": response_format(FAILOVER_SCHEMA)}  # fmt: skip
    undisturbed = await stream_chat(http, body)
    say(f"    undisturbed: {undisturbed.tokens} tokens, finish {undisturbed.finish}, {undisturbed.e2e:.1f} s")
    killed: list[str] = []

    async def kill_serving(deltas: int) -> None:
        if killed or deltas < args.kill_after:
            return
        for child, client in boards:
            if child.alive() and (await client.status()).jobs:
                os.kill(child.pid, signal.SIGKILL)
                killed.append(f"{child.name} (pid {child.pid}) after {deltas} deltas")
                return

    disturbed = await stream_chat(http, body, on_delta=kill_serving)
    for _, client in boards:
        await client.close()
    same = disturbed.text == undisturbed.text
    row("failover: SIGKILL mid-object, text equals the undisturbed run / validates",
        f"{same} / {validates(disturbed.text, FAILOVER_SCHEMA)}; killed {killed or 'nothing'}; "
        f"{disturbed.tokens} tokens, finish {disturbed.finish}")  # fmt: skip


# ---------------------------------------------------------------------------------------- main


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--parts", default="validity,saturation,tpot,compile,failover,cpu")
    p.add_argument("--dir", default="/tmp/measure-structured")
    p.add_argument("--port", type=int, default=18740)
    p.add_argument("--requests", type=int, default=200, help="validity: requests per kind")
    p.add_argument("--concurrency", type=int, default=16, help="saturation: streams")
    p.add_argument("--duration", type=float, default=30.0, help="saturation: seconds per window")
    p.add_argument("--rounds", type=int, default=2, help="saturation: plain/constrained window pairs")
    p.add_argument("--tokens", type=int, default=128, help="saturation and tpot: max_tokens")
    p.add_argument("--tpot-requests", type=int, default=20)
    p.add_argument("--compile-requests", type=int, default=20)
    p.add_argument("--cpu-requests", type=int, default=64, help="cpu: requests per window")
    p.add_argument("--kill-after", type=int, default=20, help="failover: deltas before the SIGKILL")
    args = p.parse_args()
    parts = args.parts.split(",")
    plan: list[tuple[str, int, float, Callable[[httpx.AsyncClient, LocalFleet], Awaitable[None]]]] = [
        ("validity", 1, 0.0, lambda h, f: validity(args, h, f)),
        ("saturation", 1, 1.0, lambda h, f: saturation(args, h)),
        ("tpot", 1, 1.0, lambda h, f: tpot(args, h)),
        ("compile", 1, 1.0, lambda h, f: compile_cost(args, h)),
        ("failover", 2, 1.0, lambda h, f: failover(args, h, f)),
        ("cpu", 1, 0.0, lambda h, f: cpu(args, h, f)),
    ]
    for name, boards, scale, run in plan:
        if name not in parts:
            continue
        t0 = time.perf_counter()
        with fleet(args, name, boards, scale) as local:

            async def go(local: LocalFleet = local, run: Any = run) -> None:
                async with http_client(local, args.concurrency * 2) as http:
                    await run(http, local)

            asyncio.run(go())
        say(f"== {name} took {time.perf_counter() - t0:.0f} s")
    width = max((len(m) for m, _ in ROWS), default=10)
    print("\n" + "measure".ljust(width) + " | value")
    print("-" * width + "-|-" + "-" * 40)
    for measure, value in ROWS:
        print(f"{measure.ljust(width)} | {value}")


if __name__ == "__main__":
    main()
