"""`GrammarMatcher.forced_after` (jump-forward's run, docs/daemon.md "Constrained decoding"): after
any drawn token, the run it returns is exactly the tokens whose masks allow one token each, up to
`limit`, ending after one that completes the grammar; the matcher is left as it was."""

from __future__ import annotations

import json

import numpy as np
import pytest

from calculet.daemon.grammar import GrammarCompiler, GrammarMatcher
from calculet.daemon.grammar.matcher import MatcherState
from calculet.daemon.package.manifest import load_manifest
from calculet.daemon.sampling import RowSampling, Sampler, SamplingParams
from calculet.daemon.sampling.constraint import Constraint, ConstraintKind
from calculet.ops.sim_packages.build import build_sim_package

VOCAB = 600
SCHEMA = {
    "type": "object",
    "properties": {"location": {"type": "string", "maxLength": 8}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["location", "unit"],
    "additionalProperties": False,
}
TOOL = (
    'start: "<tool_call>{\\"name\\": \\"get_weather\\", \\"arguments\\": {\\"city\\": \\"" '
    '/[a-z]{1,6}/ "\\"}}</tool_call>"'
)
CONSTRAINTS = (
    Constraint(ConstraintKind.JSON_SCHEMA, json.dumps(SCHEMA)),
    Constraint(ConstraintKind.LARK, TOOL),
    Constraint(ConstraintKind.CHOICE, choices=("yes indeed", "no")),
)


@pytest.fixture(scope="module")
def compiler(tmp_path_factory: pytest.TempPathFactory) -> GrammarCompiler:
    package = build_sim_package("tiny", tmp_path_factory.mktemp("forced") / "tiny")
    m = load_manifest(package)
    return GrammarCompiler(package / m.tokenizer.path, VOCAB, tuple(m.tokenizer.eos_token_ids))


def _single(m: GrammarMatcher) -> int | None:
    ids = np.flatnonzero(m.allowed())
    return int(ids[0]) if ids.shape[0] == 1 else None


def _stepped_run(m: GrammarMatcher, limit: int) -> tuple[list[int], bool]:
    """The run the step path takes: consume while the mask allows one token (changes `m`)."""
    run: list[int] = []
    while len(run) < limit and m.state is MatcherState.ACTIVE and (only := _single(m)) is not None:
        m.consume(only)
        run.append(only)
    return run, m.state is MatcherState.STOPPED


@pytest.mark.parametrize("c", CONSTRAINTS, ids=lambda c: c.kind.value)
@pytest.mark.parametrize("seed", range(6))
def test_forced_after_is_the_step_paths_run_and_changes_nothing(
    compiler: GrammarCompiler, c: Constraint, seed: int
) -> None:
    m = compiler.matcher(c)
    rng = np.random.default_rng(seed)
    sampler = Sampler(VOCAB, 1)
    runs = 0
    history: list[int] = []
    for step in range(80):
        if m.state is not MatcherState.ACTIVE:
            break
        allowed = m.allowed()
        x = (rng.standard_normal((1, VOCAB)) * 2.0).astype(np.float32)
        params = SamplingParams(seed=seed, temperature=1.0)
        token = sampler.sample(x, [RowSampling(params, step, allowed=allowed)])[0].token
        assert token is not None
        if m.would_stop(token):
            break
        limit = int(rng.integers(1, 12))
        run = m.forced_after(token, limit)
        assert np.array_equal(m.allowed(), allowed)  # rolled back
        twin = compiler.matcher(c)
        twin.replay(history)
        twin.consume(token)
        expected, stopped = _stepped_run(twin, limit)
        assert list(run.tokens) == expected
        assert run.completes is (stopped and bool(expected))
        runs += bool(run.tokens)
        m.consume(token)
        history.append(token)
    assert runs > 0 or c.kind is ConstraintKind.CHOICE
