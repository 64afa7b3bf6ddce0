"""Thinking budgets on the wire: the client's `ThinkingBudget` round-trips through the protobuf to the
daemon's domain `ThinkingBudget` and back; an unset message stays None; a budget over its range is
refused before conversion and a pair of equal (or unset) ids at conversion, each naming the field."""

from __future__ import annotations

import pytest

from calculet.client import SamplingParams as ClientSampling
from calculet.client import ThinkingBudget as ClientBudget
from calculet.client import convert
from calculet.common.errors import InvalidArgument
from calculet.daemon import wire
from calculet.daemon.sampling.thinking import MAX_THINKING_BUDGET, ThinkingBudget
from calculet.daemon.server.checks import thinking_range
from calculet.v1 import inference_pb2


@pytest.mark.parametrize("budget", [0, 1, 512, MAX_THINKING_BUDGET])
def test_a_budget_round_trips_client_wire_daemon(budget: int) -> None:
    client = ClientBudget(budget, open_token_id=151667, close_token_id=151668)
    pb = convert.sampling_to_pb(ClientSampling(seed=3, thinking=client))
    thinking_range(pb)
    daemon_side = wire.sampling_from_pb(pb)
    assert daemon_side.thinking == ThinkingBudget(budget, 151667, 151668)
    back = wire.sampling_to_pb(daemon_side)
    assert back.thinking == pb.thinking
    assert convert.sampling_from_pb(back).thinking == client


def test_no_budget_stays_none_on_both_sides() -> None:
    pb = convert.sampling_to_pb(ClientSampling(seed=1))
    assert not pb.HasField("thinking")
    assert wire.sampling_from_pb(pb).thinking is None
    assert convert.sampling_from_pb(pb).thinking is None


def test_a_budget_over_its_range_is_refused_before_conversion() -> None:
    pb = inference_pb2.SamplingParams(
        thinking=inference_pb2.ThinkingBudget(budget=MAX_THINKING_BUDGET + 1, open_token_id=1, close_token_id=2)
    )
    with pytest.raises(InvalidArgument, match=r"^thinking\.budget: must be at most"):
        thinking_range(pb)


@pytest.mark.parametrize(
    "pb",
    [
        inference_pb2.ThinkingBudget(budget=4),  # ids unset: both 0
        inference_pb2.ThinkingBudget(budget=4, open_token_id=9, close_token_id=9),
    ],
)
def test_equal_or_unset_ids_are_refused_naming_the_field(pb: inference_pb2.ThinkingBudget) -> None:
    with pytest.raises(InvalidArgument, match=r"^thinking\.close_token_id: must differ"):
        wire.sampling_from_pb(inference_pb2.SamplingParams(thinking=pb))


def test_the_client_checks_the_wire_ranges_only() -> None:
    for bad in (lambda: ClientBudget(-1, 1, 2), lambda: ClientBudget(2**32, 1, 2), lambda: ClientBudget(1, 1, "2")):  # type: ignore[arg-type]
        with pytest.raises(InvalidArgument, match=r"^thinking\."):
            bad()
    ClientBudget(1, 7, 7)  # the daemon judges the pair
    with pytest.raises(InvalidArgument, match=r"^thinking: must be a calculet\.client\.ThinkingBudget"):
        ClientSampling(thinking=4)  # type: ignore[arg-type]
