"""Issue 30, defects 3 and 4, on real daemon processes with calsim's `release_leak_bytes` fault
(each release keeps that many bytes of every chip the model used, until a configuration reset):

- A switch that meets a leak stops at the first release: no configure of the new package, none of
  the old one again; a Load sent to the halted board is UNAVAILABLE before it configures anything.
- An operator reset lifts the halt only once the device's memory is back at its baseline: a CCU reset
  frees nothing and says so in its result and in the audit (`calctl resets`); a configuration reset
  with a model loaded reclaims the leak, and the board serves at its baseline with no warning.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from calculet.client import DaemonClient
from calculet.client.messages import Switch
from calculet.common.errors import Unavailable
from calculet.v1.common_pb2 import (
    RESET_KIND_SWITCH,
    RESET_KIND_UNLOAD,
    SERVING_STATUS_NOT_SERVING,
    SERVING_STATUS_SERVING,
)
from tests.integration.calctl_process import one_calctl_line, run_calctl
from tests.integration.conftest import DaemonProcess

pytestmark = pytest.mark.integration
StartDaemon = Callable[..., DaemonProcess]
LEAK = 4096
LEAKY = ("--device-option", f"release_leak_bytes={LEAK}")


def dram(client: DaemonClient) -> list[int]:
    return [int(c.dram_used_bytes) for c in client.status().device.chips]


def test_a_switch_that_meets_a_leak_stops_at_the_first_release(start_daemon: StartDaemon) -> None:
    board = start_daemon("--model", "tiny=tiny", "--device-profile", "calrt-0.7.6", *LEAKY)
    with DaemonClient(board.target) as client:
        generation = next(m.generation for m in client.status().models if m.alias == "tiny")
        with pytest.raises(Unavailable, match="not verified"):
            client.load_and_wait("qwen", "qwen", switch=Switch("tiny", generation, requester="test"))
        assert dram(client) == [LEAK, LEAK], "tiny's release only: qwen never configured, tiny not loaded back"
        status = client.status()
        assert list(status.models) == [] and status.health == SERVING_STATUS_NOT_SERVING
        unload, switch = status.resets.history[-2:]
        assert (unload.kind, unload.ok, switch.kind, switch.ok) == (RESET_KIND_UNLOAD, False, RESET_KIND_SWITCH, False)
        assert "tiny not loaded back as tiny" in switch.message

        with pytest.raises(Unavailable, match="waits for an operator reset"):
            client.load_and_wait("tiny", "tiny")
        assert dram(client) == [LEAK, LEAK], "refused before it configured anything"


def test_an_operator_reset_lifts_a_leak_halt_only_with_the_memory_back(start_daemon: StartDaemon) -> None:
    board = start_daemon("--model", "tiny=tiny", *LEAKY)
    with DaemonClient(board.target) as client:
        baseline = dram(client)  # tiny alone
        client.load_and_wait("qwen", "qwen")
        client.unload("qwen")
        assert client.health().status == SERVING_STATUS_NOT_SERVING
        assert dram(client) == [used + LEAK for used in baseline]

        result = client.reset("ccu", "operator looks at the leak")
        assert not result.ok and "device memory is not back" in result.error.message, result
        assert f"chip 0 holds {LEAK:,} B DRAM" in result.error.message
        assert result.health_after == SERVING_STATUS_NOT_SERVING
        assert client.health().status == SERVING_STATUS_NOT_SERVING, "the halt stays"
        warnings = list(client.status().warnings)
        assert len(warnings) == 1 and "device memory above its baseline" in warnings[0]

        audit = json.loads(run_calctl("resets", "--json", "--daemon", board.target).stdout)
        last = audit["history"][-1]
        assert (last["kind"], last.get("ok", False)) == ("RESET_KIND_CCU", False)
        assert "device memory is not back" in last["message"]

        one_calctl_line(run_calctl("load", "qwen", "qwen", "--daemon", board.target), "unavailable")
        assert dram(client) == [used + LEAK for used in baseline], "a Load to the halted board configured nothing"

        result = client.reset("configuration", "operator reclaims the leak")
        assert result.ok, result
        assert result.health_after == SERVING_STATUS_SERVING
        assert dram(client) == baseline and list(client.status().warnings) == []
        client.load_and_wait("qwen", "qwen")
        assert list(client.status().warnings) == [], "the next Load serves at its baseline"
        answer = client.generate("qwen", [1, 2, 3], max_tokens=4, seed=7, ignore_eos=True)
        assert len(list(answer)) == 4
