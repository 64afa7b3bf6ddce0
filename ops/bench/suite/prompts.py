"""The prompt file of one suite run: `calctl bench --prompts FILE` lines (docs/benchmarking.md).

Owns how a run's requests are drawn: `warmup` short requests of `WARMUP_OUTPUT` tokens first (the
bench's `--warmup` takes the first lines), then `requests` measured ones: exactly
`round(long_fraction * requests)` of them long (`long_prompt` tokens) at positions drawn at random,
the others short (uniform in `short_prompt`), each asking for `output` tokens. Token ids are uniform
below the model's vocabulary. The lengths come from `random.Random` seeded by the suite seed, the
workload, the concurrency and the request count (not the configuration), so every configuration and
target that runs the same workload at the same concurrency gets the same requests.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from calculet.ops.bench.suite.matrix import SuiteRun

WARMUP_OUTPUT = 4


@dataclass(frozen=True)
class PromptLine:
    """One line: its prompt length and output tokens (the tokens are drawn when written)."""

    prompt: int
    output: int


def plan_lines(run: SuiteRun, seed: int) -> list[PromptLine]:
    """The run's lines: warm-up first, then the measured requests (module docstring)."""
    w = run.workload
    rng = random.Random(f"{seed}:{w.name}:{run.concurrency}:{run.requests}:{run.warmup}")
    lo, hi = w.short_prompt
    warm = [PromptLine(rng.randint(lo, hi), min(WARMUP_OUTPUT, w.output)) for _ in range(run.warmup)]
    n_long = round(w.long_fraction * run.requests)
    long_at = set(rng.sample(range(run.requests), n_long))
    measured = [
        PromptLine(w.long_prompt if i in long_at else rng.randint(lo, hi), w.output) for i in range(run.requests)
    ]
    return warm + measured


def prompts_name(run: SuiteRun) -> str:
    """The file name of a run's prompts: one file per workload, concurrency and request count."""
    return f"{run.workload.name}.c{run.concurrency}.n{run.requests}.w{run.warmup}.jsonl"


def write_prompts(path: Path, lines: list[PromptLine], vocab: int, seed: int) -> Path:
    """Write `lines` as JSONL (`{"prompt_tokens": [...], "max_tokens": N}`), ids below `vocab`, drawn
    from a generator seeded by `seed` and the file name.

    Raises:
        OSError: the file cannot be written.
    """
    rng = random.Random(f"{seed}:{path.name}:tokens")
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as out:
        for line in lines:
            tokens = [rng.randrange(vocab) for _ in range(line.prompt)]
            out.write(json.dumps({"prompt_tokens": tokens, "max_tokens": line.output}, separators=(",", ":")) + "\n")
    return path
