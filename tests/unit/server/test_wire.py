"""The wire module: one mapping of error kinds to status codes, lossless request/event round trips."""

from __future__ import annotations

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from calculet.client import convert
from calculet.common import error_codes
from calculet.common.errors import ErrorKind, InvalidArgument, Overloaded
from calculet.daemon import wire
from calculet.daemon.core.events import FinalEvent, FinishReason, Timings, TokenChunk, TokenLogprob, Usage
from calculet.daemon.core.request import GenerationRequest, StoppingParams
from calculet.daemon.sampling.params import SamplingParams
from calculet.daemon.server import errors as server_errors
from calculet.v1 import common_pb2


def test_every_error_kind_has_one_grpc_code_and_maps_back() -> None:
    assert set(wire.GRPC_CODE) == set(ErrorKind)
    assert len(set(wire.GRPC_CODE.values())) == len(ErrorKind), "two kinds share a code"
    for kind, code in wire.GRPC_CODE.items():
        assert wire.KIND_OF_CODE[code] is kind
        assert wire.kind_from_pb(wire.kind_to_pb(kind)) is kind
        # The wire enum's numbers are the gRPC status codes (common.proto).
        assert wire.kind_to_pb(kind) == code.value[0]


def test_the_code_table_lives_in_one_place_shared_with_the_client() -> None:
    from calculet.client import errors as client_errors

    for table in (wire.GRPC_CODE, server_errors.GRPC_CODE):
        assert table is error_codes.GRPC_CODE
    assert wire.KIND_OF_CODE is client_errors.KIND_OF_CODE is error_codes.KIND_OF_CODE
    assert wire.RETRY_AFTER_KEY == server_errors.RETRY_AFTER_KEY == client_errors.RETRY_AFTER_KEY
    assert wire.error_from_kind is client_errors.error_from_kind is error_codes.error_from_kind


def test_overloaded_keeps_its_retry_hint_and_unknown_numbers_read_as_internal() -> None:
    err = wire.error_from_kind(ErrorKind.OVERLOADED, "full", retry_after_s=0.0)
    assert isinstance(err, Overloaded) and err.retry_after_s == 0.0
    assert wire.kind_from_pb(99) is ErrorKind.INTERNAL
    assert wire.GRPC_CODE[ErrorKind.OVERLOADED] is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert common_pb2.ErrorKind.Name(wire.kind_to_pb(ErrorKind.UNAVAILABLE)) == "ERROR_KIND_UNAVAILABLE"


tokens = st.lists(st.integers(0, 151_935), max_size=20).map(tuple)


@given(
    prompt=tokens.filter(bool),
    resume=tokens,
    seed=st.integers(0, 2**64 - 1),
    temperature=st.floats(0, 5),
    top_p=st.floats(0.01, 1),
    priority=st.integers(-1000, 1000),
    max_tokens=st.integers(1, 5000),
    logprobs=st.none() | st.integers(0, 20),
    deadline=st.none() | st.integers(1, 10**6).map(lambda ms: ms / 1000),
)
def test_request_round_trips_through_protobuf(
    prompt, resume, seed, temperature, top_p, priority, max_tokens, logprobs, deadline
) -> None:
    sampling = SamplingParams(seed=seed, temperature=temperature, top_p=top_p, logprobs=logprobs)
    req = GenerationRequest(
        "m", prompt, sampling, StoppingParams(max_tokens, (3, 4), True), "cid", resume, priority, deadline, "s"
    )
    back = wire.request_from_pb(wire.request_to_pb(req), default_max_tokens=1)
    # temperature and top_p travel as 32-bit floats
    assert abs(back.sampling.temperature - temperature) <= 1e-6 * max(1.0, temperature)
    assert abs(back.sampling.top_p - top_p) <= 1e-6
    assert back.prompt_tokens == prompt and back.resume_tokens == resume
    assert back.sampling.seed == seed and back.sampling.logprobs == logprobs
    assert back.priority == priority, "the wire flips the sign; the round trip must not"
    assert back.stopping == req.stopping and back.deadline_s == deadline


def test_unset_seed_is_drawn_and_unset_max_tokens_uses_the_default() -> None:
    pb = wire.request_to_pb(GenerationRequest("m", (1,), SamplingParams(seed=5), StoppingParams(max_tokens=3)))
    pb.sampling.ClearField("seed")
    pb.stopping.ClearField("max_tokens")
    seeds = {wire.request_from_pb(pb, default_max_tokens=77).sampling.seed for _ in range(4)}
    assert len(seeds) > 1, "an unset seed must be drawn per request"
    assert wire.request_from_pb(pb, default_max_tokens=77).stopping.max_tokens == 77


def test_events_round_trip_including_deadline_and_errors() -> None:
    chunk = TokenChunk(0, 5, (9, 8), (TokenLogprob(9, -0.5, ((9, -0.5), (2, -1.25))), TokenLogprob(8, -0.25)))
    assert wire.event_from_pb(wire.event_to_pb(chunk)) == chunk
    for reason, kind in [
        (FinishReason.STOP, None),
        (FinishReason.LENGTH, None),
        (FinishReason.CANCELLED, None),
        (FinishReason.DEADLINE, ErrorKind.DEADLINE_EXCEEDED),
        (FinishReason.ERROR, ErrorKind.ABORTED),
    ]:
        final = FinalEvent(3, reason, Usage(4, 2, 1), Timings(0.25, 0.5, 0.75, 1.0, 2.0), kind, "m" if kind else "")
        assert wire.event_from_pb(wire.event_to_pb(final)) == final


def test_an_overloaded_final_carries_its_retry_hint_in_band() -> None:
    final = FinalEvent(1, FinishReason.ERROR, Usage(4, 0), Timings(), ErrorKind.OVERLOADED, "no lane", 2.5)
    pb = wire.event_to_pb(final)
    assert pb.final.error.HasField("retry_after_s") and pb.final.error.retry_after_s == 2.5
    assert wire.event_from_pb(pb) == final
    error = convert.final_from_pb(pb.index, pb.final).error  # what the gateway's client rebuilds
    assert isinstance(error, Overloaded) and error.retry_after_s == 2.5
    plain = wire.event_to_pb(FinalEvent(1, FinishReason.ERROR, Usage(4, 0), Timings(), ErrorKind.ABORTED, "x"))
    assert not plain.final.error.HasField("retry_after_s")


def test_raw_logits_are_refused_rather_than_silently_ignored() -> None:
    pb = wire.request_to_pb(GenerationRequest("m", (1,), SamplingParams(), StoppingParams(max_tokens=3)))
    pb.sampling.return_logits = True
    with pytest.raises(InvalidArgument, match="return_logits"):
        wire.request_from_pb(pb, default_max_tokens=1)
