"""Load, unload and reload under traffic; cancel mid-decode; an idle daemon does not spin."""

from __future__ import annotations

import threading
import time

import psutil
import pytest

from calculet.client import DaemonClient
from calculet.common.errors import CalculetError, ErrorKind, Unavailable

from .helpers import assert_idle_soon, idle_problems, poll
from .oracle import Req, generate, make_requests, run_sequential

pytestmark = pytest.mark.integration
WAIT_S = 60.0


class Traffic:
    """Threads generating against one alias until stopped; records every outcome."""

    def __init__(self, target: str, model: str, reqs: list[Req], threads: int = 4) -> None:
        self.target, self.model, self.reqs = target, model, reqs
        self.completed: list[tuple[int, list[int], int, int]] = []  # (req index, tokens, gen submit, gen final)
        self.errors: list[CalculetError] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, args=(i,)) for i in range(threads)]

    def __enter__(self) -> Traffic:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=120)

    def served_on(self, generation: int) -> bool:
        """Some request admitted on `generation` has completed."""
        with self._lock:
            return any(admitted == generation for _, _, admitted, _ in self.completed)

    def error_count(self) -> int:
        with self._lock:
            return len(self.errors)

    def _run(self, worker: int) -> None:
        with DaemonClient(self.target) as client:
            i = worker
            while not self._stop.is_set():
                r = self.reqs[i % len(self.reqs)]
                try:
                    g = client.generate(self.model, r.prompt, max_tokens=r.max_tokens, seed=r.seed,
                                        temperature=r.temperature, top_k=r.top_k, top_p=r.top_p,
                                        ignore_eos=r.ignore_eos)  # fmt: skip
                    admitted_on = g.generation  # before the Final: the generation Submit reported
                    tokens = list(g)
                    assert g.final is not None
                    with self._lock:
                        self.completed.append((i % len(self.reqs), tokens, admitted_on, g.generation))
                except CalculetError as exc:
                    with self._lock:
                        self.errors.append(exc)
                    time.sleep(0.01)
                i += 1


def test_load_unload_reload_under_traffic(start_daemon) -> None:
    daemon = start_daemon("--model", "tiny=tiny")
    reqs = make_requests(8, vocab=512, seed=3, max_out=24)
    reference = run_sequential(daemon.target, "tiny", reqs)
    # Each change waits until the traffic has met the state before it (polls, not sleeps: on a busy
    # machine a fixed pause could pass with no request served, or none sent into the unload's gap).
    # What the refusals in the gap were is checked below.
    with DaemonClient(daemon.target) as ops, Traffic(daemon.target, "tiny", reqs) as traffic:
        poll(lambda: traffic.served_on(1), "a request served by generation 1", WAIT_S)
        ops.load_and_wait("tiny", "tiny", replace=True)  # beside the old generation, switch when Ready
        poll(lambda: traffic.served_on(2), "a request served by generation 2", WAIT_S)
        errors_before = traffic.error_count()
        ops.unload("tiny", drain_timeout_ms=5000)
        poll(lambda: traffic.error_count() > errors_before, "a request refused in the unload's gap", WAIT_S)
        ops.load_and_wait("tiny", "tiny")
        poll(lambda: traffic.served_on(3), "a request served by generation 3", WAIT_S)
        final_generation = ops.status().models[0].generation
    assert traffic.completed, "traffic made no progress"
    bad = [e for e in traffic.errors if e.kind is not ErrorKind.UNAVAILABLE]
    assert not bad, f"only UNAVAILABLE may reach clients during lifecycle changes: {bad[:3]}"
    assert any(isinstance(e, Unavailable) for e in traffic.errors), "the unload gap should have been visible"
    for index, tokens, gen_submit, gen_final in traffic.completed:
        assert gen_submit == gen_final, "a completion crossed generations"
        assert tokens == reference[index], "a request served during reloads differs from its undisturbed run"
    generations = {g for _, _, g, _ in traffic.completed}
    assert len(generations) >= 2, f"traffic should have been served by several generations: {generations}"
    assert final_generation == 3
    with DaemonClient(daemon.target) as client:
        assert_idle_soon(client)
        status = client.status()
    assert [m.generation for m in status.models] == [3], "old generations must be unloaded"


def test_cancel_mid_decode_frees_the_lane_without_disturbing_others(start_daemon) -> None:
    # A real-time board (time scale 1) so the long request is surely mid-decode when cancelled.
    daemon = start_daemon("--model", "tiny=tiny", "--time-scale", "0.2")
    others = make_requests(3, vocab=512, seed=5, max_out=12)
    reference = run_sequential(daemon.target, "tiny", others)
    with DaemonClient(daemon.target) as client:
        long = client.generate("tiny", [4, 5, 6], max_tokens=200, temperature=0.0, ignore_eos=True)
        it = iter(long)
        for _ in range(3):
            next(it)
        results: list[list[int]] = [[] for _ in others]

        def serve_other(i: int) -> None:
            with DaemonClient(daemon.target) as other:
                results[i] = generate(other, "tiny", others[i])

        threads = [threading.Thread(target=serve_other, args=(i,)) for i in range(len(others))]
        for t in threads:
            t.start()
        lane_busy = [j for j in client.status().jobs if j.job_id == long.job_id]
        assert lane_busy and lane_busy[0].HasField("lane")
        assert client.cancel(long.job_id) is True
        for t in threads:
            t.join(timeout=60)
        assert results == reference
        assert_idle_soon(client)
        assert len(long.tokens) < 200


def test_idle_daemon_burns_almost_no_cpu(start_daemon) -> None:
    daemon = start_daemon("--model", "tiny=tiny")
    proc = psutil.Process(daemon.proc.pid)
    time.sleep(1.0)  # let start-up work settle
    before = proc.cpu_times()
    time.sleep(3.0)
    after = proc.cpu_times()
    used = (after.user - before.user) + (after.system - before.system)
    assert used < 0.15, f"idle daemon used {used:.3f}s of CPU in 3s: something polls"
    with DaemonClient(daemon.target) as client:
        assert not idle_problems(client)
