"""Running boards as a service (issue 10): a SIGTERM mid-stream drains (the running request completes
with the text of an undisturbed run, new requests go to the other board), and a reset storm drives a
board NOT_SERVING within its budget while the fleet serves on and the audit trail shows every reset."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from typing import Any

import pytest

from calculet.client import CalculetError, DaemonClient
from calculet.v1.common_pb2 import RESET_KIND_DRAIN, SERVING_STATUS_NOT_SERVING, SERVING_STATUS_SERVING
from tests.integration.conftest import DaemonProcess
from tests.integration.gateway_process import GatewayProcess, Oracle
from tests.integration.helpers import poll
from tests.integration.test_gateway_fleet import MESSAGES, WAIT_S, accepted, chat, running_jobs, stream_text

pytestmark = pytest.mark.integration
StartDaemon = Callable[..., DaemonProcess]
StartGateway = Callable[..., GatewayProcess]


def test_sigterm_mid_stream_finishes_the_running_request_and_new_ones_go_elsewhere(
    start_daemon: StartDaemon, start_gateway: StartGateway
) -> None:
    # Board a serves at the modelled board speed: 300 tokens take several seconds, so it is mid-stream.
    a = start_daemon("--model", "qwen=qwen", "--time-scale", "1", "--drain-timeout", "120")
    b = start_daemon("--board", "1", "--model", "qwen=qwen")
    gateway = start_gateway("--daemon", a.target, "--daemon", b.target)
    gateway.wait_until(lambda body: sorted(body["boards"].values()) == ["up", "up"], "both boards up")
    request: dict[str, Any] = {"model": "qwen", "messages": MESSAGES, "max_tokens": 300, "seed": 7, "temperature": 0.9}
    client = gateway.openai(timeout=180)
    stream = iter(
        client.chat.completions.create(
            **request, stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
            user="pin-to-a",
        )
    )  # fmt: skip
    chunks = [next(stream) for _ in range(4)]
    on_a = running_jobs(a) == 1
    if not on_a:  # routed to b: swap the roles, the property is the same
        a, b = b, a
    assert running_jobs(a) == 1
    before_b = accepted(b)
    a.proc.send_signal(signal.SIGTERM)  # drain: the running request completes, nothing new is admitted
    gateway.wait_until(lambda body: list(body["boards"].values()).count("up") == 1, "the draining board left")
    answered = chat(gateway, "qwen", max_tokens=4)
    assert answered.status_code == 200, answered.text
    assert accepted(b) == before_b + 1, "the new request went to the other board"
    chunks.extend(stream)
    assert a.proc.wait(60) == 0, "the drained daemon stopped cleanly"
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == 300
    oracle = Oracle(b.target, "qwen")
    expected = oracle.tokens(oracle.chat_prompt(MESSAGES), seed=7, max_tokens=300, temperature=0.9, ignore_eos=True)
    assert stream_text(chunks) == oracle.text(expected), "the drained request's text is that of an undisturbed run"


def test_a_reset_storm_stops_one_board_within_its_budget_and_the_fleet_serves_on(
    start_daemon: StartDaemon, start_gateway: StartGateway
) -> None:
    # A hang is found by the job timeout, in wall time: 2 s, so that an ordinary job on a loaded
    # machine is never taken for one (0.5 s was: a slow job used up the budget early).
    storm = start_daemon(
        "--model", "tiny=tiny", "--fault-injection", "--job-timeout", "2", "--reset-limit", "2"
    )  # fmt: skip
    calm = start_daemon("--board", "1", "--model", "tiny=tiny")
    gateway = start_gateway("--daemon", storm.target, "--daemon", calm.target)
    gateway.wait_until(lambda body: sorted(body["boards"].values()) == ["up", "up"], "both boards up")
    with DaemonClient(storm.target) as ops:
        outcomes = []
        for _ in range(3):  # each hang costs one automatic reset; the third is past the budget of 2
            ops.inject_fault("hang")
            try:
                ops.generate("tiny", [1, 2, 3], max_tokens=2, seed=1, ignore_eos=True).result()
                outcomes.append("recovered")
            except CalculetError as exc:
                outcomes.append(exc.kind.value)
        assert outcomes == ["recovered", "recovered", "unavailable"], outcomes
        poll(lambda: ops.health().status == SERVING_STATUS_NOT_SERVING, "the storm board stops serving", WAIT_S)
        history = list(ops.status().resets.history)
    assert [(r.automatic, r.fault, r.ok) for r in history] == [
        (True, "hang", True),
        (True, "hang", True),
        (True, "budget exhausted", False),
    ], history
    stormed, calm_before = accepted(storm), accepted(calm)
    for seed in range(6):  # the gateway routes on the boards' load reports, which say NOT_SERVING
        answered = chat(gateway, "tiny", max_tokens=4, seed=seed)
        assert answered.status_code == 200, answered.text
    assert accepted(calm) == calm_before + 6, "the fleet served on the calm board"
    assert accepted(storm) == stormed, "the gateway routed nothing to the board past its budget"
    os.kill(storm.proc.pid, signal.SIGTERM)


def test_a_streak_of_submit_errors_drains_a_board_its_stream_fails_over_and_resume_brings_it_back(
    start_daemon: StartDaemon, start_gateway: StartGateway
) -> None:
    """Issue 21: three submit errors in a row drain the board (NOT_SERVING with the reason, audited);
    its running stream resumes on the other board with the text of an undisturbed run; the gateway
    routes new requests away until an operator resumes the board."""
    flags = ("--model", "qwen=qwen", "--fault-injection", "--submit-error-streak", "3", "--time-scale", "1")
    a = start_daemon(*flags)
    b = start_daemon("--board", "1", *flags)
    gateway = start_gateway("--daemon", a.target, "--daemon", b.target)
    gateway.wait_until(lambda body: sorted(body["boards"].values()) == ["up", "up"], "both boards up")
    request: dict[str, Any] = {"model": "qwen", "messages": MESSAGES, "max_tokens": 300, "seed": 11, "temperature": 0.9}
    stream = iter(
        gateway.openai(timeout=180).chat.completions.create(
            **request, stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True}
        )
    )
    chunks = [next(stream) for _ in range(4)]
    if running_jobs(a) != 1:  # routed to b: swap the roles, the property is the same
        a, b = b, a
    with DaemonClient(a.target) as ops:
        planned = ops.inject_fault("submit_error")  # one error the stream recovers from (no streak yet)
        first = int(planned.next_job_index) + 100  # well ahead of the stream's next submits
        for k in range(3):  # three submit attempts in a row fail: a decode step and both re-prefills
            ops.inject_fault("submit_error", job_index=first + k)
        chunks.extend(stream)  # the stream fails over to b and finishes there
        poll(lambda: ops.health().status == SERVING_STATUS_NOT_SERVING, "the board drained itself", WAIT_S)
        drains = [r for r in ops.status().resets.history if r.kind == RESET_KIND_DRAIN]
        assert len(drains) == 1 and drains[0].automatic and drains[0].fault == "submit error streak", drains
        assert "3 consecutive submit errors" in drains[0].reason and drains[0].inflight_jobs == 1
        usage = chunks[-1].usage
        assert usage is not None and usage.completion_tokens == 300
        oracle = Oracle(b.target, "qwen")
        expected = oracle.tokens(
            oracle.chat_prompt(MESSAGES), seed=11, max_tokens=300, temperature=0.9, ignore_eos=True
        )
        assert stream_text(chunks) == oracle.text(expected), "the failed-over stream's text is an undisturbed run's"
        gateway.wait_until(lambda body: body["models"] == {"qwen": 1}, "the gateway serves qwen on one board")
        drained, other = accepted(a), accepted(b)
        for seed in range(3):
            assert chat(gateway, "qwen", max_tokens=4, seed=seed).status_code == 200
        assert (accepted(a), accepted(b)) == (drained, other + 3), "new requests went to the other board"
        ops.resume()  # the operator brings it back
        poll(lambda: ops.health().status == SERVING_STATUS_SERVING, "the board serves again", WAIT_S)
    gateway.wait_until(lambda body: body["models"] == {"qwen": 2}, "the gateway serves qwen on both boards again")
