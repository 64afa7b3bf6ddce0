"""Issue 19 against real daemons: conversations that do not pay twice, parked lanes that cost admission
nothing, a queue bound that counts only requests waiting for a lane, faults between turns that leave
the next turn cold and correct, chunked prefill that equals one job, and a calbin that ignores the
prefill offset caught at load.

Every comparison is with a cold run of the same request and seed on a daemon with prefix reuse off
(bit for bit on the tiny package's numeric kernel, logprobs included).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from calculet.client import DaemonClient
from calculet.common.errors import CalculetError, ErrorKind
from calculet.daemon.package.manifest import load_manifest
from calculet.ops.sim_packages.build import build_sim_package
from calculet.ops.sim_packages.golden import compute_golden
from calculet.v1.observe_pb2 import LANE_STATE_FREE, LANE_STATE_PARKED, PREFILL_OFFSET_VERDICT_REFUTED

from .conftest import DaemonProcess
from .helpers import assert_idle_soon

pytestmark = pytest.mark.integration

StartDaemon = Callable[..., DaemonProcess]
LANES16 = "tiny16p"  # this module's 16-lane tiny package
Turn = tuple[list[int], list[float]]  # tokens, logprobs


@pytest.fixture(scope="module")
def tiny16(models_root: Path) -> str:
    if not (models_root / LANES16).exists():
        build_sim_package("tiny", models_root / LANES16, decode_batches=(1, 4, 16), lanes=16)
    return LANES16


def turn(client: DaemonClient, prompt: list[int], seed: int, max_tokens: int = 12) -> tuple[Turn, object]:
    gen = client.generate(
        "tiny", prompt, max_tokens=max_tokens, seed=seed, temperature=0.9, top_p=0.95, logprobs=2, ignore_eos=True
    )
    tokens, logprobs = [], []
    for chunk in gen.chunks():
        tokens += chunk.tokens
        logprobs += [lp.logprob for lp in chunk.logprobs]
    return (tokens, logprobs), gen.final


def chat(client: DaemonClient, turns: int = 5) -> list[tuple[list[int], Turn, int]]:
    """A 5-turn conversation: each prompt is the previous one, its answer and 8 new tokens. Returns
    per turn (prompt, (tokens, logprobs), cached_tokens)."""
    prompt = [(5 * i + 2) % 500 for i in range(24)]
    out = []
    for k in range(turns):
        result, final = turn(client, prompt, seed=40 + k)
        out.append((list(prompt), result, final.usage.cached_tokens))  # type: ignore[attr-defined]
        prompt = [*prompt, *result[0], *((3 * k + j) % 500 for j in range(8))]
    return out


def test_a_five_turn_conversation_prefills_only_its_new_tokens_and_equals_a_cold_run(
    start_daemon: StartDaemon,
) -> None:
    cold = start_daemon("--model", "tiny=tiny", "--prefix-reuse", "off")
    warm = start_daemon("--model", "tiny=tiny")
    with DaemonClient(cold.target) as c, DaemonClient(warm.target) as w:
        want, got = chat(c), chat(w)
        for k, ((_prompt, result, cached), (_, expected, cold_cached)) in enumerate(zip(got, want, strict=True)):
            assert result == expected, f"turn {k}: tokens or logprobs differ from the cold run"
            assert cold_cached == 0
            if k:
                previous_prompt, (previous_tokens, _), _ = got[k - 1]
                assert cached == len(previous_prompt) + len(previous_tokens) - 1, f"turn {k}"
        status = w.status().models[0]
        assert status.prefix_cache.hits == 4 and status.prefix_cache.hit_tokens == sum(t[2] for t in got)
        assert_idle_soon(w)


def test_a_stranger_with_the_same_system_prompt_never_takes_a_warm_conversations_lane_while_lanes_are_free(
    start_daemon: StartDaemon,
) -> None:
    """Issue 30, defect 6: the conversation's own part past a 40-token system prompt is 61 tokens
    (under the continuation tolerance of 64); a stranger with that system prompt comes while 3 of
    the 4 lanes are FREE. The conversation's next turn gets 101 cached tokens, not 40."""
    cold = start_daemon("--model", "tiny=tiny", "--prefix-reuse", "off")
    warm = start_daemon("--model", "tiny=tiny")
    system = [(3 * i + 1) % 500 for i in range(40)]
    first = [*system, *((7 * i + 4) % 500 for i in range(10))]
    stranger = [*system, *((11 * i + 6) % 500 for i in range(10))]
    with DaemonClient(cold.target) as c, DaemonClient(warm.target) as w:
        (answer, _), _ = turn(w, first, seed=1, max_tokens=52)
        assert turn(c, first, seed=1, max_tokens=52)[0][0] == answer
        lanes = sorted(lane.state for lane in w.status().models[0].lanes)
        assert lanes == [LANE_STATE_FREE] * 3 + [LANE_STATE_PARKED], "3 FREE lanes and the conversation's"
        for client in (w, c):
            assert turn(client, stranger, seed=2, max_tokens=8)[1].usage.cached_tokens == 0  # type: ignore[attr-defined]
        following = [*first, *answer, 300, 301, 302]
        got, final = turn(w, following, seed=3)
        assert final.usage.cached_tokens == len(first) + len(answer) - 1 == 101  # type: ignore[attr-defined]
        assert got == turn(c, following, seed=3)[0], "the tokens and logprobs of a cold run"
        assert_idle_soon(w)


@pytest.mark.parametrize("between", ["ccu_exception", "reset_ccu", "reset_configuration", "reload"])
def test_after_a_fault_reset_or_reload_between_turns_the_next_turn_runs_cold_and_correct(
    start_daemon: StartDaemon, between: str
) -> None:
    cold = start_daemon("--model", "tiny=tiny", "--prefix-reuse", "off")
    warm = start_daemon("--model", "tiny=tiny", "--fault-injection")
    first = [(5 * i + 2) % 500 for i in range(24)]
    with DaemonClient(cold.target) as c, DaemonClient(warm.target) as w:
        (answer, _), _ = turn(w, first, seed=1)
        assert turn(c, first, seed=1)[0][0] == answer
        second = [*first, *answer, 7, 8, 9]
        expected, _ = turn(c, second, seed=2)
        if between == "ccu_exception":  # on another request's job: no parked KV is trusted after it
            w.inject_fault("ccu_exception")
            turn(w, [1, 2, 3], seed=3, max_tokens=3)
        elif between == "reload":
            w.unload("tiny")
            w.load_and_wait("tiny", "tiny")
        else:
            assert w.reset(between.removeprefix("reset_"), "between turns").ok
        got, final = turn(w, second, seed=2)
        assert final.usage.cached_tokens == 0, "the next turn runs cold"  # type: ignore[attr-defined]
        assert got == expected
        assert_idle_soon(w)
    assert "stale KV" not in warm.log(), "the device never refused a row: no stale KV was trusted"


def test_full_parking_admits_a_burst_of_unrelated_prompts_at_once(start_daemon: StartDaemon, tiny16: str) -> None:
    """16 lanes parked, queue depth 1: 16 unrelated prompts at once are all admitted (each evicts a parked
    lane); were parked lanes not free, 15 of them would wait for a lane and be refused."""
    daemon = start_daemon("--model", f"tiny={tiny16}", "--queue-depth", "1")
    with DaemonClient(daemon.target) as client:
        for i in range(16):
            turn(client, [100 + i, 7, 7, 7], seed=i, max_tokens=2)
        assert client.status().models[0].prefix_cache.parked_lanes == 16
        errors: list[BaseException] = []
        finals: list[object] = []

        def one(i: int) -> None:
            try:
                finals.append(turn(client, [300 + i, 9, 9], seed=50 + i, max_tokens=4)[1])
            except CalculetError as exc:
                errors.append(exc)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors, errors
        assert len(finals) == 16
        status = client.status()
        assert status.models[0].prefix_cache.evictions == 16 and status.job_counters.rejected == 0
        assert_idle_soon(client)


def test_a_burst_of_lanes_plus_queue_depth_is_admitted_whole_and_the_next_is_refused(
    start_daemon: StartDaemon, tiny16: str
) -> None:
    """16 free lanes and --queue-depth 8: the device hangs on the first job, so nothing finishes and every
    request either holds a lane or waits for one; the 24th is admitted, the 25th refused."""
    daemon = start_daemon("--model", f"tiny={tiny16}", "--queue-depth", "8", "--fault-injection", "--job-timeout", "60")
    with DaemonClient(daemon.target) as client:
        client.inject_fault("hang")
        jobs = [client.submit("tiny", [i + 1, 2, 3], max_tokens=4, seed=i).job_id for i in range(24)]
        with pytest.raises(CalculetError) as refused:
            client.submit("tiny", [99, 2, 3], max_tokens=4, seed=99)
        assert refused.value.kind is ErrorKind.OVERLOADED and "8 requests wait for a KV lane" in str(refused.value)
        assert len(set(jobs)) == 24
        for job in jobs:
            client.cancel(job)
        assert client.reset("ccu", "end the planned hang").ok
        assert_idle_soon(client, timeout=30)


def test_a_chunked_prefill_equals_one_job(start_daemon: StartDaemon) -> None:
    whole = start_daemon("--model", "tiny=tiny", "--prefill-chunk-tokens", "off")
    chunked = start_daemon("--model", "tiny=tiny", "--prefill-chunk-tokens", "24")
    prompt = [(11 * i + 4) % 500 for i in range(180)]
    with DaemonClient(whole.target) as a, DaemonClient(chunked.target) as b:
        assert b.status().models[0].prefill_chunk_tokens == 24
        want, _ = turn(a, prompt, seed=8, max_tokens=20)
        submitted = b.status().device_counters.submitted
        got, _ = turn(b, prompt, seed=8, max_tokens=20)
        assert got == want
        jobs = b.status().device_counters.submitted - submitted
        assert jobs == -(-180 // 24) + 19, "8 prefill chunks, then 19 decode steps"
        assert_idle_soon(b)


def test_a_calbin_ignoring_the_offset_serves_unchunked_without_reuse_and_answers_as_a_cold_run(
    start_daemon: StartDaemon, models_root: Path
) -> None:
    # calsim's fault: every prefill runs as if its lane were empty. The load's offset check must see
    # it and turn chunking and reuse off; the answers are then the kernel's own greedy run, computed
    # here at offset 0 (a cold run), for a prompt auto chunking would split and for its next turn.
    daemon = start_daemon("--model", "tiny=tiny", "--device-option", "prefill_ignores_offset=true")
    manifest = load_manifest(models_root / "tiny")
    first = [(7 * i + 3) % 500 for i in range(150)]
    with DaemonClient(daemon.target) as client:
        m = client.status().models[0]
        offset = m.prefill_offset
        assert offset.verdict == PREFILL_OFFSET_VERDICT_REFUTED, offset
        assert "the continued run's first logits differ" in offset.reason
        assert not (offset.chunked_prefill or offset.prefix_reuse or offset.jump_forward)
        assert not m.prefix_cache.enabled and m.prefill_chunk_tokens == 256  # one job: the prefill bucket
        prompt = first
        for _ in range(2):
            cold = compute_golden(manifest, models_root / "tiny", prompt).decode_tokens
            gen = client.generate("tiny", prompt, max_tokens=len(cold), temperature=0.0, ignore_eos=True)
            assert list(gen) == list(cold)
            assert gen.final.usage.cached_tokens == 0  # type: ignore[attr-defined]
            prompt = [*prompt, *cold, 9, 8, 7]  # the next turn: its KV would have been reused
        assert_idle_soon(client)
