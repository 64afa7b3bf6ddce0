"""Jump-forward measured (issue 31, deliverable 7; docs/daemon.md "Constrained decoding"): output
tokens per second of a `tool_choice: "required"` call and of a schema'd answer, with forced runs
prefilled at an offset (the package declares `prefill_at_offset`) and decoded step by step (the
same package without the declaration).

Not a test. Builds (or reuses) the calsim qwen3-30b-a3b package twice under `--dir` (same weights:
`qwen` declares the offset prefill, `qwensteps` does not), then for each runs an in-process daemon
core (`DeviceCore`, calsim at `--time-scale`, 1 = the modelled board in real time) and submits
`--requests` requests per constraint, `--concurrency` at a time (closed loop), with the same seeds
on both packages. The `required` call's constraint is the gateway's own (`gateway/api/tool_grammar.py`
over two offered functions, Qwen3's `<tool_call>` tokens); the schema'd answer is a JSON schema with
keys, enums and bounded values. Reports per row: completion tokens, output tokens/s (completion
tokens / wall time of the loop), device jobs per request, forced tokens appended per request, and
checks that both packages produced the same tokens; and tokens per modelled compute second (the
device clock's compute time of the loop's jobs: what the device spent, whatever the host's load).

    .venv/bin/python bench/jump_forward_measure.py [--dir /tmp/measure-jump] [--requests 16]
        [--concurrency 1,4] [--time-scale 1.0]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

from tokenizers import Tokenizer

from calculet.client import Constraint as ClientConstraint
from calculet.daemon.core.config import DaemonConfig
from calculet.daemon.core.device_core import DeviceCore
from calculet.daemon.core.events import FinalEvent, wait_finished
from calculet.daemon.core.request import GenerationRequest, StoppingParams
from calculet.daemon.package.manifest import load_manifest
from calculet.daemon.sampling.constraint import Constraint, ConstraintKind
from calculet.daemon.sampling.params import SamplingParams
from calculet.gateway.api.tool_grammar import call_tags, tool_call_constraint
from calculet.gateway.api.tool_schemas import Tool
from calculet.ops.sim_packages.build import build_sim_package

PRESET = "qwen3-30b-a3b"
PACKAGES = {"jump": "qwen", "steps": "qwensteps"}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "maxLength": 12},
                    "unit": {"enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city", "unit"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "parameters": {
                "type": "object",
                "properties": {"timezone": {"type": "string", "maxLength": 12}},
                "required": ["timezone"],
                "additionalProperties": False,
            },
        },
    },
]
SCHEMA = {
    "type": "object",
    "properties": {
        "location": {"type": "string", "maxLength": 12},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "forecast_days": {"type": "integer", "minimum": 1, "maximum": 14},
        "include_hourly": {"type": "boolean"},
        "fields": {"type": "array", "items": {"enum": ["temperature", "wind", "humidity"]}, "maxItems": 3},
    },
    "required": ["location", "unit", "forecast_days", "include_hourly", "fields"],
    "additionalProperties": False,
}


def packages(root: Path) -> Path:
    for mode, name in PACKAGES.items():
        if not (root / name / "calculet-package.json").exists():
            declared = True if mode == "jump" else None
            build_sim_package(PRESET, root / name, decode_batches=(1, 4), lanes=4, lane_context=2048,
                              prefill_at_offset=declared)  # fmt: skip
    return root


def constraints(pkg: Path) -> dict[str, Constraint]:
    tok = Tokenizer.from_file(str(pkg / load_manifest(pkg).tokenizer.path))
    tools = [Tool.model_validate(t) for t in TOOLS]
    required = tool_call_constraint(tools, "required", False, call_tags(tok.token_to_id))
    assert isinstance(required, ClientConstraint)
    return {
        "tool_choice required": Constraint(ConstraintKind.LARK, required.text),
        "json_schema answer": Constraint(ConstraintKind.JSON_SCHEMA, json.dumps(SCHEMA)),
    }


def request(alias: str, c: Constraint, seed: int) -> GenerationRequest:
    prompt = tuple(range(1000, 1064))  # a 64-token prompt; the answer's shape comes from the grammar
    sampling = SamplingParams(seed=seed, temperature=0.7, constraint=c)
    return GenerationRequest(alias, prompt, sampling, StoppingParams(max_tokens=256, ignore_eos=False))


def collect(core: DeviceCore, job_id: str) -> list[int]:
    log = core.event_log(job_id, for_wait=False)
    assert wait_finished(log, 600.0), job_id
    events = log.read(0)
    final = events[-1]
    assert isinstance(final, FinalEvent), final
    return [t for e in events[:-1] for t in getattr(e, "tokens", ())]


@dataclasses.dataclass
class Row:
    tokens: list[list[int]]
    seconds: float
    device_jobs: int
    forced: int
    compute_s: float  # modelled device compute seconds of the loop's jobs (the device's clock)


def run(core: DeviceCore, alias: str, c: Constraint, seeds: range, concurrency: int) -> Row:
    rt = core.models.published(alias)
    assert rt is not None
    before = core.status()
    jobs0, compute0, forced0 = before.device_counters.submitted, before.utilization.compute_seconds, rt.jumps.tokens
    out: dict[int, list[int]] = {}
    pending = list(seeds)
    began = time.perf_counter()
    running: list[tuple[int, str]] = []
    while pending or running:
        while pending and len(running) < concurrency:
            seed = pending.pop(0)
            running.append((seed, core.submit(request(alias, c, seed)).job_id))
        seed, job = running.pop(0)  # closed loop: collect in order, refill
        out[seed] = collect(core, job)
    seconds = time.perf_counter() - began
    after = core.status()
    jobs = after.device_counters.submitted - jobs0
    return Row([out[s] for s in seeds], seconds, jobs, rt.jumps.tokens - forced0,
               after.utilization.compute_seconds - compute0)  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="/tmp/measure-jump")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--concurrency", default="1,4")
    ap.add_argument("--time-scale", type=float, default=1.0)
    args = ap.parse_args()
    root = packages(Path(args.dir))
    cs = constraints(root / PACKAGES["jump"])
    levels = [int(x) for x in args.concurrency.split(",")]
    seeds = range(args.requests)
    results: dict[tuple[str, str, int], Row] = {}
    for mode, name in PACKAGES.items():
        options = {"time_scale": args.time_scale, "configure_time_scale": 0.0}  # the load is not measured
        core = DeviceCore(DaemonConfig(models_root=root, models=((name, name),), device_options=options))
        core.start()
        try:
            for label, c in cs.items():
                run(core, name, c, range(1000, 1002), 1)  # compile and warm the grammar
                for n in levels:
                    results[(mode, label, n)] = run(core, name, c, seeds, n)
        finally:
            core.close()
    print(f"{'constraint':22} {'conc':>4} {'mode':>5} {'tokens':>7} {'tok/s':>7} {'jobs/req':>8} {'forced/req':>10} "
          f"{'tok/compute-s':>13}")  # fmt: skip
    for label in cs:
        for n in levels:
            base = results[("steps", label, n)]
            for mode in PACKAGES:
                r = results[(mode, label, n)]
                assert r.tokens == base.tokens, f"{label}: jump-forward changed the tokens"
                total = sum(len(t) for t in r.tokens)
                print(f"{label:22} {n:4} {mode:>5} {total:7} {total / r.seconds:7.1f} "
                      f"{r.device_jobs / len(seeds):8.1f} {r.forced / len(seeds):10.1f} "
                      f"{total / r.compute_s:13.1f}")  # fmt: skip
            gain = (sum(len(t) for t in base.tokens) / results[("jump", label, n)].seconds) / (
                sum(len(t) for t in base.tokens) / base.seconds
            )
            print(f"{'':22} {n:4} jump/steps output tokens/s x{gain:.2f}")


if __name__ == "__main__":
    main()
