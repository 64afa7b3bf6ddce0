"""The correctness oracle: a request's tokens must not depend on what else the board was doing.

`make_requests` builds a deterministic mix (prompt and output lengths, greedy and sampled);
`run_sequential` serves them one at a time (the undisturbed reference); `run_concurrent` serves
them all at once from threads. Tests compare the two token lists exactly.
"""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass

from calculet.client import DaemonClient


@dataclass(frozen=True)
class Req:
    prompt: tuple[int, ...]
    max_tokens: int
    seed: int
    temperature: float
    top_k: int | None
    top_p: float | None
    ignore_eos: bool


def make_requests(n: int, vocab: int, seed: int, max_prompt: int = 60, max_out: int = 40) -> list[Req]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        greedy = i % 2 == 0
        out.append(
            Req(
                prompt=tuple(rng.randrange(vocab) for _ in range(rng.randint(2, max_prompt))),
                max_tokens=rng.randint(3, max_out),
                seed=1000 + i,
                temperature=0.0 if greedy else rng.choice([0.7, 1.0, 1.3]),
                top_k=None if greedy else rng.choice([None, 20, 50]),
                top_p=None if greedy else rng.choice([None, 0.9]),
                ignore_eos=i % 3 == 0,
            )
        )
    return out


def generate(client: DaemonClient, model: str, r: Req) -> list[int]:
    g = client.generate(
        model,
        r.prompt,
        max_tokens=r.max_tokens,
        seed=r.seed,
        temperature=r.temperature,
        top_k=r.top_k,
        top_p=r.top_p,
        ignore_eos=r.ignore_eos,
    )
    return list(g)


def run_sequential(target: str, model: str, reqs: list[Req]) -> list[list[int]]:
    with DaemonClient(target) as client:
        return [generate(client, model, r) for r in reqs]


def run_concurrent(target: str, model: str, reqs: list[Req]) -> list[list[int]]:
    results: list[list[int] | BaseException] = [[] for _ in reqs]
    start = threading.Barrier(len(reqs))

    def worker(i: int) -> None:
        try:
            with DaemonClient(target) as client:
                start.wait()
                results[i] = generate(client, model, reqs[i])
        except BaseException as exc:  # reported by the test below
            results[i] = exc

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(reqs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        raise AssertionError(f"{len(errors)} concurrent requests failed, first: {errors[0]!r}")
    return [r for r in results if not isinstance(r, BaseException)]
