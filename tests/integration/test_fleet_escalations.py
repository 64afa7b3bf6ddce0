"""Issue 21, docs/sources.md 000 §14: each escalation on real processes, two boards behind the gateway.

A 300-token stream runs on board a (qwen preset at the modelled board speed, so it is mid-stream);
calsim's fault plan then drives the fault on a, well ahead of the stream's next device jobs:

- repeated CCU exceptions: a resets its compute units itself (audited, automatic); the stream
  continues on a, re-prefilled, with the text of an undisturbed run;
- repeated NaN logits: a quarantines the model (audited); the stream ends UNAVAILABLE there and
  the gateway resumes it on b with the text of an undisturbed run; a's golden check passes again and
  the gateway routes to both boards again;
- a lost device: the reset cannot restore it, so a exits with status 75 for its supervisor; the
  stream fails over to b with the text of an undisturbed run; a board started again in its place
  rejoins the fleet and its audit trail (the journal in the runtime directory) shows the failed
  reset and the restart of the process before it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from calculet.client import DaemonClient
from calculet.daemon.core.resets.escalations import EXIT_DEVICE_UNHEALTHY
from calculet.v1.common_pb2 import (
    MODEL_STATE_READY,
    RESET_KIND_CCU,
    RESET_KIND_CONFIGURATION,
    RESET_KIND_DRAIN,
    RESET_KIND_QUARANTINE,
    RESET_KIND_RESTART,
    SERVING_STATUS_SERVING,
)
from tests.integration.conftest import DaemonProcess
from tests.integration.gateway_process import GatewayProcess, Oracle
from tests.integration.helpers import poll
from tests.integration.test_gateway_fleet import MESSAGES, WAIT_S, running_jobs, stream_text

pytestmark = pytest.mark.integration
StartDaemon = Callable[..., DaemonProcess]
StartGateway = Callable[..., GatewayProcess]
TOKENS = 300
AHEAD = 100  # device jobs between planning and the first fault: the stream is surely still running then


class Fleet:
    """Two qwen boards at time scale 1 behind a gateway, and a stream running on board `a`."""

    def __init__(self, start_daemon: StartDaemon, start_gateway: StartGateway, *flags: str) -> None:
        self.flags = ("--model", "qwen=qwen", "--fault-injection", "--time-scale", "1", *flags)
        self.a = start_daemon(*self.flags)
        self.b = start_daemon("--board", "1", *self.flags)
        self.gateway = start_gateway("--daemon", self.a.target, "--daemon", self.b.target)
        self.gateway.wait_until(lambda body: sorted(body["boards"].values()) == ["up", "up"], "both boards up")
        self.seed = 21
        request: dict[str, Any] = {"model": "qwen", "messages": MESSAGES, "max_tokens": TOKENS, "seed": self.seed}
        self.stream: Iterator[Any] = iter(
            self.gateway.openai(timeout=180).chat.completions.create(
                **request, temperature=0.9, stream=True, stream_options={"include_usage": True},
                extra_body={"ignore_eos": True},
            )
        )  # fmt: skip
        self.chunks = [next(self.stream) for _ in range(4)]
        self.a_board = "0"  # the board index a runs (to start it again as itself)
        if running_jobs(self.a) != 1:  # routed to b: swap the roles, the property is the same
            self.a, self.b, self.a_board = self.b, self.a, "1"

    def plan_on_a(self, kind: str, count: int) -> None:
        """`count` faults of `kind` on a's consecutive submit attempts, `AHEAD` attempts from now."""
        with DaemonClient(self.a.target) as ops:
            first = int(ops.inject_fault().next_job_index) + AHEAD  # reads the index, plans nothing
            for k in range(count):
                ops.inject_fault(kind, job_index=first + k)

    def finish_stream_exactly(self, oracle_board: DaemonProcess) -> None:
        """Read the stream to its end: all its tokens, with the text of an undisturbed run."""
        self.chunks.extend(self.stream)
        usage = self.chunks[-1].usage
        assert usage is not None and usage.completion_tokens == TOKENS
        oracle = Oracle(oracle_board.target, "qwen")
        prompt = oracle.chat_prompt(MESSAGES)
        expected = oracle.tokens(prompt, seed=self.seed, max_tokens=TOKENS, temperature=0.9, ignore_eos=True)
        assert stream_text(self.chunks) == oracle.text(expected), "the stream's text is an undisturbed run's"

    def both_routed(self, what: str) -> None:
        self.gateway.wait_until(lambda body: body["models"] == {"qwen": 2}, what)


def test_repeated_ccu_exceptions_reset_the_board_itself_and_the_stream_continues_exactly(
    start_daemon: StartDaemon, start_gateway: StartGateway
) -> None:
    fleet = Fleet(start_daemon, start_gateway, "--ccu-escalation", "2")
    fleet.plan_on_a("ccu_exception", 2)  # a decode step and its re-prefill
    fleet.finish_stream_exactly(fleet.b)
    with DaemonClient(fleet.a.target) as ops:
        poll(lambda: any(r.kind == RESET_KIND_CCU for r in ops.status().resets.history), "a's automatic reset", WAIT_S)
        (entry,) = ops.status().resets.history
        assert entry.automatic and entry.fault == "ccu exceptions" and entry.ok, entry
        assert entry.reason.startswith("2 CCU exceptions within 60s")
        assert entry.health_before == entry.health_after == SERVING_STATUS_SERVING, entry
        assert "qwen@" in entry.generations_after[0]
        assert ops.health().status == SERVING_STATUS_SERVING
    fleet.both_routed("the gateway routes to both boards")


def test_repeated_nan_logits_quarantine_the_model_and_the_stream_resumes_on_the_other_board(
    start_daemon: StartDaemon, start_gateway: StartGateway
) -> None:
    fleet = Fleet(start_daemon, start_gateway, "--nan-escalation", "2")
    fleet.plan_on_a("nan_logits", 2)
    fleet.finish_stream_exactly(fleet.b)
    with DaemonClient(fleet.a.target) as ops:
        poll(
            lambda: any(r.kind == RESET_KIND_QUARANTINE for r in ops.status().resets.history), "a's quarantine", WAIT_S
        )
        (entry,) = ops.status().resets.history
        assert entry.automatic and entry.fault == "non-finite logits" and entry.ok, entry
        assert "golden check passed" in entry.message and entry.health_after == SERVING_STATUS_SERVING, entry
        assert entry.inflight_jobs == 1, "the stream was running on a when it was quarantined"
        poll(lambda: [m.state for m in ops.status().models] == [MODEL_STATE_READY], "qwen Ready again on a", WAIT_S)
    fleet.both_routed("the gateway routes to both boards again")


def test_a_lost_device_exits_for_a_restart_and_the_stream_resumes_on_the_other_board(
    start_daemon: StartDaemon, start_gateway: StartGateway
) -> None:
    fleet = Fleet(start_daemon, start_gateway)
    fleet.plan_on_a("device_lost", 1)
    fleet.finish_stream_exactly(fleet.b)
    assert fleet.a.proc.wait(60) == EXIT_DEVICE_UNHEALTHY, fleet.a.log()
    log = fleet.a.log()
    assert "exiting with status 75 for the supervisor to restart the daemon" in log, log
    fleet.gateway.wait_until(lambda body: body["models"] == {"qwen": 1}, "the gateway serves qwen on one board")
    # What systemd's Restart=on-failure does: the same board, socket and runtime directory.
    runtime = {"XDG_RUNTIME_DIR": str(fleet.a.workdir / "xdg-runtime")}
    again = start_daemon("--board", fleet.a_board, *fleet.flags, listen=fleet.a.target, env=runtime)
    fleet.both_routed("the restarted board rejoins")
    with DaemonClient(again.target) as ops:  # the trail of the process that exited, from the journal
        history = ops.status().resets.history
    assert [(r.kind, r.fault, r.ok) for r in history] == [
        (RESET_KIND_CONFIGURATION, "device unhealthy", False),
        (RESET_KIND_RESTART, "device unhealthy", False),
        (RESET_KIND_DRAIN, "operator", True),  # the exiting process's shutdown drain
    ], history
    assert "exiting with status 75" in history[1].message and history[1].health_before != SERVING_STATUS_SERVING
    assert history[2].reason == "shutdown" and not history[2].automatic
