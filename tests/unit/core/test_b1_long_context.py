"""Today's batch-1 calbin (`qwen3-30b-a3b-b1`: one lane of 40,960 tokens, prefill bucket 40,960, no
`prefill_at_offset`) served in-process at time scale 0: a 30,000-token prompt is one prefill job
whose modelled time is the timing model's, and a conversation past 40,000 tokens gives the same
tokens whether its turns reuse the parked lane or re-prefill cold, under the serial policy
(`calctl up`'s default for it) and under the continuous one with chunking off.
"""

from __future__ import annotations

import logging
from contextlib import AbstractContextManager
from pathlib import Path

import pytest

from calculet.daemon.calsim.timing import prefill_ms
from calculet.daemon.core.chunking import CHUNK_OFF
from calculet.daemon.core.device_core import DeviceCore
from calculet.daemon.package.manifest import load_manifest
from calculet.ops.sim_packages.build import build_sim_package
from tests.unit.core.engine_factories import assert_clean, finish, request, running_core

B1 = "qwen3-30b-a3b-b1"
LONG_PROMPT = 30_000
# (policy, prefix reuse, prefill chunk): calctl up's default today, the same once undeclared packages
# serve without reuse, and the continuous policy with chunking off.
SETTINGS = (("serial", True, CHUNK_OFF), ("serial", False, CHUNK_OFF), ("continuous", False, CHUNK_OFF))
# New tokens and answer length per turn: 20,000 + 32 + 10,000 + 32 + 9,900 + 64 = 40,028 tokens.
TURNS = ((20_000, 32), (10_000, 32), (9_900, 64))


@pytest.fixture(scope="module")
def b1_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("b1")
    build_sim_package(B1, root / B1)
    return root


def _core(models: Path, policy: str, reuse: bool, chunk: int) -> AbstractContextManager[DeviceCore]:
    return running_core(
        models,
        model=B1,
        policy=policy,
        prefix_reuse=reuse,
        prefill_chunk=chunk,
        device_options={"profile": "calrt-0.7.6"},  # the one-calbin board the package's matrix names
    )


def _tokens(n: int, start: int) -> tuple[int, ...]:
    return tuple(1_000 + (start + i) % 150_000 for i in range(n))


def test_a_30000_token_prompt_is_one_prefill_job_of_the_modelled_time(
    b1_models: Path, caplog: pytest.LogCaptureFixture
) -> None:
    timing = load_manifest(b1_models / B1).timing
    with (
        caplog.at_level(logging.WARNING, "calculet.daemon.core.models"),
        _core(b1_models, "serial", False, CHUNK_OFF) as core,
    ):
        # The load says what the validator let through: the prefill's vendor label, ignored.
        assert any(
            "submodel.label_ignored" in r.getMessage() and "llm_decode" in r.getMessage() for r in caplog.records
        )
        before = core.status().utilization
        tokens, final = finish(core, core.submit(request(_tokens(LONG_PROMPT, 0), 1, seed=1, model=B1)).job_id)
        after = core.status().utilization
        assert len(tokens) == 1 and final.usage.prompt_tokens == LONG_PROMPT
        # One job: its compute is one prefill of 30,000 tokens (a chunked one would pay the fixed
        # cost per chunk and read the KV again).
        compute = after.compute_seconds - before.compute_seconds
        assert compute == pytest.approx(prefill_ms(timing, LONG_PROMPT, 0) / 1000.0, rel=1e-6)
        assert_clean(core)


def test_a_40000_token_conversation_gives_the_same_tokens_under_every_setting(b1_models: Path) -> None:
    answers: dict[tuple[str, bool, int], list[list[int]]] = {}
    for setting in SETTINGS:
        with _core(b1_models, *setting) as core:
            history: tuple[int, ...] = ()
            answers[setting] = []
            for turn, (new, out) in enumerate(TURNS):
                history += _tokens(new, len(history))
                tokens, final = finish(core, core.submit(request(history, out, seed=turn, model=B1)).job_id)
                assert len(tokens) == out and final.usage.prompt_tokens == len(history)
                answers[setting].append(tokens)
                history += tuple(tokens)
            assert len(history) >= 40_000
            assert_clean(core)
    reference = answers[SETTINGS[1]]  # serial, every turn prefilled cold
    assert all(a == reference for a in answers.values()), {s: [t[:4] for t in a] for s, a in answers.items()}
