"""Host CPU cost of constrained decoding per token at the Qwen vocabulary (docs/daemon.md
"Constrained decoding"): what the completion thread adds to a constrained row's step.

Not a test: builds (or reuses) the calsim qwen3-30b-a3b package for its real 151,669-token tokenizer
(model vocabulary 151,936), then generates under a JSON schema and a free-text-heavy regex from
language-model-shaped BF16 logits, and prints the median and p90 microseconds per token of
- mask: the matcher's next-token bitmask (llguidance) unpacked to a bool row (`GrammarMatcher.allowed`);
- sample+: the sampler's extra time on the masked row over the same row unconstrained;
- advance: the stop check and the consume (`would_stop`, `consume`);
and, once, the tokenizer build and each grammar's compile.

    .venv/bin/python bench/constrained_bench.py [--package DIR] [--tokens 200]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import ml_dtypes
import numpy as np

from calculet.daemon.grammar import GrammarCompiler
from calculet.daemon.package.manifest import load_manifest
from calculet.daemon.sampling import RowSampling, Sampler, SamplingParams
from calculet.daemon.sampling.constraint import Constraint, ConstraintKind

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "address": {"type": "object", "properties": {"street": {"type": "string"}, "zip": {"type": "string"}}},
    },
    "required": ["name", "age", "tags", "address"],
}
CONSTRAINTS = {
    "json_schema": Constraint(ConstraintKind.JSON_SCHEMA, json.dumps(SCHEMA)),
    "regex (free text)": Constraint(ConstraintKind.REGEX, r"[A-Za-z ,.]{1,400}\."),
}


def _package(path: str | None) -> Path:
    if path:
        return Path(path)
    from calculet.ops.sim_packages.build import build_sim_package

    out = Path(tempfile.gettempdir()) / "calculet-constrained-bench" / "qwen"
    if not (out / "calculet-package.json").exists():
        build_sim_package("qwen3-30b-a3b", out, decode_batches=(1,), lanes=1, lane_context=2048)
    return out


def _us(samples: list[float]) -> str:
    s = sorted(samples)
    return f"{statistics.median(s) * 1e6:8.1f} {s[int(0.9 * (len(s) - 1))] * 1e6:8.1f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--package")
    ap.add_argument("--tokens", type=int, default=200)
    args = ap.parse_args()
    pkg = _package(args.package)
    m = load_manifest(pkg)
    vocab = m.architecture.vocab_size
    compiler = GrammarCompiler(pkg / m.tokenizer.path, vocab, tuple(m.tokenizer.eos_token_ids))
    t0 = time.perf_counter()
    compiler.matcher(Constraint(ConstraintKind.REGEX, "x"))
    print(f"vocab {vocab}: tokenizer build + first compile {time.perf_counter() - t0:.2f} s")
    sampler = Sampler(vocab, 1)
    rng = np.random.default_rng(0)

    print(f"{'constraint':20} {'tokens':>6} | us/token median p90: {'mask':>17} {'sample+':>17} {'advance':>17}")
    for name, c in CONSTRAINTS.items():
        t0 = time.perf_counter()
        compiler.matcher(c)
        compile_s = time.perf_counter() - t0
        matcher = compiler.matcher(c)
        mask_t: list[float] = []
        extra_t: list[float] = []
        adv_t: list[float] = []
        eos = set(compiler.eos_ids)
        for step in range(args.tokens):
            x = rng.standard_normal((1, vocab)) * 2.0
            x[0, rng.choice(vocab, size=5, replace=False)] = [16.0, 15.0, 14.0, 13.0, 12.0]
            logits = x.astype(ml_dtypes.bfloat16)
            params = SamplingParams(seed=step, temperature=0.8)
            t0 = time.perf_counter()
            allowed = matcher.allowed()
            t1 = time.perf_counter()
            token = sampler.sample(logits, [RowSampling(params, step, allowed=allowed)])[0].token
            t2 = time.perf_counter()
            sampler.sample(logits, [RowSampling(params, step)])
            t3 = time.perf_counter()
            assert token is not None
            stops = matcher.would_stop(token)
            matcher.consume(token)
            t4 = time.perf_counter()
            mask_t.append(t1 - t0)
            extra_t.append((t2 - t1) - (t3 - t2))
            adv_t.append(t4 - t3)
            if stops or token in eos:
                matcher = compiler.matcher(c)  # start another output
        row = f"{name:20} {len(mask_t):6} |  {_us(mask_t)} {_us(extra_t)} {_us(adv_t)}"
        print(f"{row}   (compile {compile_s * 1e3:.1f} ms)")


if __name__ == "__main__":
    main()
