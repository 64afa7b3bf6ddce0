"""Jump-forward through real daemon processes over gRPC (docs/daemon.md "Constrained decoding"):
a `required`-style tool call (a Lark grammar whose wrapper and name are forced) streams the same
tokens, logprobs, finish and usage from a package that declares `prefill_at_offset` (forced runs
are prefilled, not decoded) as from the same package without the declaration (decoded step by
step); and resumed inside the forced wrapper it continues with the undisturbed tokens."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from calculet.client import Constraint, DaemonClient, FinalEvent, FinishReason, SamplingParams, TokenChunk
from calculet.ops.sim_packages.build import build_sim_package
from tests.integration.conftest import DaemonProcess

pytestmark = pytest.mark.integration

TOOL = (
    'start: "<tool_call>\\n{\\"name\\": \\"get_weather\\", \\"arguments\\": {\\"city\\": \\"" '
    '/[a-z]{1,8}/ "\\"}}\\n</tool_call>"'
)
PROMPT = (5, 6, 7, 8)


@pytest.fixture(scope="module")
def models_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This module's packages: tiny declaring the offset prefill, and the same weights without it."""
    root = tmp_path_factory.mktemp("jump-models")
    build_sim_package("tiny", root / "tiny")
    build_sim_package("tiny", root / "tinysteps", prefill_at_offset=None)
    return root


def _calls(c: DaemonClient, seeds: range, resume: tuple[int, ...] = ()) -> list[tuple[object, ...]]:
    out = []
    for seed in seeds:
        sampling = SamplingParams(seed=seed, temperature=1.0, logprobs=2, constraint=Constraint.of_lark(TOOL))
        job = c.submit("tiny", PROMPT, sampling=sampling, max_tokens=80, resume_tokens=resume).job_id
        events = list(c.wait(job))
        final = events[-1]
        assert isinstance(final, FinalEvent)
        tokens = tuple(t for e in events if isinstance(e, TokenChunk) for t in e.tokens)
        logprobs = tuple(lp for e in events if isinstance(e, TokenChunk) for lp in e.logprobs)
        out.append((tokens, logprobs, final.reason, final.usage.completion_tokens))
    return out


def test_a_tool_call_streams_the_same_with_and_without_jumps(start_daemon: Callable[..., DaemonProcess]) -> None:
    jumps = start_daemon("--model", "tiny=tiny")
    steps = start_daemon("--model", "tiny=tinysteps")
    with DaemonClient(jumps.target) as a, DaemonClient(steps.target) as b:
        got, want = _calls(a, range(6)), _calls(b, range(6))
        assert got == want
        # The same warm-up and tokens from fewer device jobs: the forced wrapper ran in no step.
        jobs_a, jobs_b = (c.status().device_counters.submitted for c in (a, b))
        assert jobs_a < jobs_b - 6 * 30, (jobs_a, jobs_b)
        tok = Tokenizer.from_str(a.get_model("tiny").tokenizer_json.decode())
        for tokens, _, reason, used in got:
            text = tok.decode(list(tokens), skip_special_tokens=True)
            assert reason is FinishReason.STOP and text.startswith('<tool_call>\n{"name": "get_weather"'), text
            assert used == len(tokens)
        full = got[0][0]
        for k in (1, 3, 10):  # inside the forced wrapper (the first token's run is ~40 tokens)
            rest = _calls(a, range(1), resume=full[:k])[0][0]
            assert full[:k] + rest == full, k
