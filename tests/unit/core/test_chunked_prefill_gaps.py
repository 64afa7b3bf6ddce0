"""Chunked prefill keeps running streams flowing, measured on calsim's modelled device clock (never
the wall clock): while 4 streams decode, a 2,000-token prompt arrives; with chunks, no stream waits
longer between two of its tokens than one chunk's modelled prefill plus one decode step (plus the
copies); without them it waits the whole prompt's prefill. The long prompt's tokens are the same
either way."""

from __future__ import annotations

import threading
from collections import defaultdict
from pathlib import Path

import pytest

from calculet.daemon.calsim.timing import decode_ms, prefill_ms
from calculet.daemon.core.chunking import CHUNK_AUTO, CHUNK_OFF, auto_chunk_tokens
from calculet.daemon.core.observe.observer import DeviceJobDone, EngineObserver
from calculet.daemon.device.types import JobStatus, TaskType
from calculet.daemon.package.manifest import load_manifest
from calculet.ops.sim_packages.build import build_sim_package

from .engine_factories import assert_clean, finish, request, running_core, until

LONG_PROMPT = 2000
STREAMS = 4
COPY_ALLOWANCE_MS = 2.0  # H2D of a chunk's tokens and D2H of a few logits rows: well under a millisecond each


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("chunk-gaps")
    build_sim_package("qwen3-30b-a3b", root / "qwen", decode_batches=(1, 4), lanes=5, lane_context=2304)
    return root


class DecodeEnds(EngineObserver):
    """Device-clock end of every DONE decode job, per request it carried; and the prefill jobs."""

    def __init__(self) -> None:
        self.ends: dict[str, list[float]] = defaultdict(list)
        self.prefills: list[DeviceJobDone] = []
        self.lock = threading.Lock()

    def device_job_done(self, event: DeviceJobDone) -> None:
        if event.status is not JobStatus.DONE or event.stamps is None:
            return
        with self.lock:
            if event.task is TaskType.PREFILL:
                self.prefills.append(event)
            for row in event.rows:
                if event.task is TaskType.DECODE and row.token:
                    self.ends[row.job_id].append(event.stamps.d2h_end)


def run_scene(models: Path, chunk: int) -> tuple[float, list[int], int]:
    """4 streams decoding, then the long prompt. Returns the streams' largest device-clock gap while
    the long prompt was prefilled, its tokens and how many prefill jobs it took."""
    observer = DecodeEnds()
    with running_core(models, model="qwen", prefill_chunk=chunk) as core:
        core.engine.add_observer(observer)
        streams = [core.submit(request((i + 1,) * 16, 300, seed=i, model="qwen")).job_id for i in range(STREAMS)]
        until("the streams decode", lambda: all(len(observer.ends[j]) >= 3 for j in streams))
        long_job = core.submit(request(tuple(range(7, 7 + LONG_PROMPT)), 4, seed=99, model="qwen")).job_id
        long_tokens, _ = finish(core, long_job, timeout=120.0)
        for job in streams:
            core.cancel(job)
            finish(core, job)
        assert core.engine.flush_observers(10.0)
        assert_clean(core)
    with observer.lock:
        long_prefills = [p for p in observer.prefills if any(r.job_id == long_job for r in p.rows)]
        start = min(p.stamps.compute_start for p in long_prefills if p.stamps is not None)
        end = max(p.stamps.d2h_end for p in long_prefills if p.stamps is not None)
        gaps = [
            b - a
            for job in streams
            for a, b in zip(observer.ends[job], observer.ends[job][1:], strict=False)
            if b > start and a < end  # a gap overlapping the long prompt's prefill
        ]
    assert gaps, "the streams decoded while the long prompt was prefilled"
    return max(gaps), long_tokens, len(long_prefills)


def test_streams_wait_at_most_one_chunk_while_a_long_prompt_prefills(models: Path) -> None:
    chunked_gap, chunked_tokens, chunked_jobs = run_scene(models, CHUNK_AUTO)
    whole_gap, whole_tokens, whole_jobs = run_scene(models, CHUNK_OFF)
    timing = load_manifest(models / "qwen").timing
    chunk = auto_chunk_tokens(timing, decode_batch=4)
    assert (chunked_jobs, whole_jobs) == (-(-LONG_PROMPT // chunk), 1), "the long prompt ran as chunks"
    worst_chunk_ms = prefill_ms(timing, chunk, LONG_PROMPT - chunk)  # the last chunk reads the most KV
    decode_step_ms = decode_ms(timing, 4, 2304)
    bound_s = (worst_chunk_ms + decode_step_ms + COPY_ALLOWANCE_MS) / 1000.0
    assert chunked_gap <= bound_s, f"a stream waited {chunked_gap:.3f} s (device clock), bound {bound_s:.3f} s"
    whole_prefill_s = prefill_ms(timing, LONG_PROMPT, 0) / 1000.0
    assert whole_gap >= whole_prefill_s, "without chunks a stream waits the whole prefill"
    assert chunked_tokens == whole_tokens, "chunked prefill gives the unchunked run's tokens"
