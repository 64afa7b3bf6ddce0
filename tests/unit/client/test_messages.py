"""Request building: what reaches the wire for each argument, and the typed refusals (no server)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from calculet.client import SamplingParams
from calculet.client.messages import (
    MAX_DRAIN_WINDOW_S,
    Switch,
    drain_request,
    inject_fault_request,
    load_outcome,
    load_request,
    operation_timeout,
    reset_request,
    sampling_params,
    submit_request,
    unload_request,
    wait_request,
    watch_load_request,
)
from calculet.common.errors import CalculetError, ErrorKind, FailedPrecondition, InvalidArgument, Overloaded
from calculet.v1 import common_pb2, inference_pb2, operate_pb2


def gen(**overrides: Any) -> inference_pb2.SubmitRequest:
    args: dict[str, Any] = dict(
        max_tokens=None, temperature=None, top_p=None, top_k=None, seed=None, stop_token_ids=(), ignore_eos=False,
        logprobs=None, priority=0, client_request_id="", resume_tokens=(), sampling=None, deadline_s=None,
        session_id="",
    )  # fmt: skip
    args.update(overrides)
    return submit_request(args.pop("model", "tiny"), args.pop("prompt", [5, 6, 7]), **args)


def test_defaults_leave_seed_max_tokens_and_sampling_to_the_daemon() -> None:
    pb = gen()
    assert not pb.sampling.HasField("seed")
    assert not pb.stopping.HasField("max_tokens")
    assert not pb.HasField("deadline_ms")
    assert list(pb.prompt_tokens) == [5, 6, 7]
    # unset = the daemon's default (inference.proto: temperature 1.0, top_p 1.0, no penalty, no logprobs)
    for name in ("temperature", "top_p", "repetition_penalty", "logprobs"):
        assert not pb.sampling.HasField(name), name
    s = pb.sampling
    assert (s.top_k, s.min_p, s.presence_penalty, s.frequency_penalty, s.return_logits) == (0, 0.0, 0.0, 0.0, False)
    assert (pb.priority, pb.client_request_id, pb.session_id, list(pb.resume_tokens)) == (0, "", "", [])
    assert list(pb.stopping.stop_token_ids) == [] and not pb.stopping.ignore_eos


@given(
    seed=st.integers(0, 2**64 - 1),
    max_tokens=st.integers(1, 2**32 - 1),
    priority=st.integers(-(2**31), 2**31 - 1),
    stops=st.lists(st.integers(0, 2**32 - 1), max_size=5),
    resume=st.lists(st.integers(0, 2**32 - 1), max_size=5),
)
def test_given_fields_reach_the_wire_unchanged(
    seed: int, max_tokens: int, priority: int, stops: list[int], resume: list[int]
) -> None:
    pb = gen(seed=seed, max_tokens=max_tokens, priority=priority, stop_token_ids=stops, resume_tokens=resume)
    assert pb.sampling.HasField("seed") and pb.sampling.seed == seed
    assert pb.stopping.HasField("max_tokens") and pb.stopping.max_tokens == max_tokens
    assert pb.priority == priority  # wire convention both sides: lower is served first
    assert list(pb.stopping.stop_token_ids) == stops
    assert list(pb.resume_tokens) == resume


def test_sampling_object_is_sent_with_its_seed() -> None:
    params = SamplingParams(
        seed=9, temperature=0.0, top_k=4, top_p=0.5, min_p=0.1, repetition_penalty=1.25, presence_penalty=-0.5,
        frequency_penalty=1.5, logprobs=3,
    )  # fmt: skip
    pb = gen(sampling=params, ignore_eos=True, deadline_s=1.5, session_id="s", client_request_id="r")
    s = pb.sampling
    assert (s.seed, s.temperature, s.top_k, s.min_p, s.logprobs) == (9, 0.0, 4, pytest.approx(0.1), 3)
    assert s.HasField("temperature") and s.HasField("seed")
    assert s.top_p == pytest.approx(0.5) and s.repetition_penalty == 1.25
    assert (s.presence_penalty, s.frequency_penalty) == (-0.5, 1.5)
    assert pb.stopping.ignore_eos and pb.deadline_ms == 1500
    assert (pb.session_id, pb.client_request_id) == ("s", "r")


def test_a_sampling_object_without_a_seed_leaves_the_seed_to_the_daemon() -> None:
    pb = gen(sampling=SamplingParams(temperature=0.5))
    assert not pb.sampling.HasField("seed") and pb.sampling.temperature == 0.5
    assert not pb.sampling.HasField("top_p")


def test_individual_fields_build_the_sampling() -> None:
    params = sampling_params(None, temperature=0.25, top_p=0.75, top_k=5, seed=3, logprobs=0)
    assert params == SamplingParams(seed=3, temperature=0.25, top_k=5, top_p=0.75, logprobs=0)
    assert sampling_params(None, temperature=None, top_p=None, top_k=None, seed=None, logprobs=None) == SamplingParams()
    given = SamplingParams(seed=1)
    assert sampling_params(given, temperature=None, top_p=None, top_k=None, seed=None, logprobs=None) is given


def test_a_daemon_sampling_object_is_refused_by_name() -> None:
    class Other:  # e.g. calculet.daemon.sampling.params.SamplingParams, which the client does not take
        seed = 1

    with pytest.raises(InvalidArgument, match=r"sampling: must be a calculet\.client\.SamplingParams"):
        gen(sampling=Other())


@pytest.mark.parametrize("field", ["temperature", "top_p", "top_k", "seed", "logprobs"])
def test_sampling_and_individual_fields_are_exclusive(field: str) -> None:
    value = {"temperature": 0.5, "top_p": 0.5, "top_k": 3, "seed": 1, "logprobs": 1}[field]
    with pytest.raises(InvalidArgument, match=f"sampling: .*{field}"):
        gen(sampling=SamplingParams(), **{field: value})


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"prompt": [1, -1]}, "prompt_tokens\\[1\\]"),
        ({"prompt": [2**32]}, "prompt_tokens\\[0\\]"),
        ({"prompt": [1.5]}, "prompt_tokens\\[0\\]"),
        ({"prompt": [True]}, "prompt_tokens\\[0\\]"),
        ({"resume_tokens": [-3]}, "resume_tokens\\[0\\]"),
        ({"stop_token_ids": [1, 2**40]}, "stop_token_ids\\[1\\]"),
        ({"max_tokens": -1}, "max_tokens"),
        ({"max_tokens": 2**32}, "max_tokens"),
        ({"priority": 2**31}, "priority"),
        ({"priority": 1.0}, "priority"),
        ({"deadline_s": 0}, "deadline_s"),
        ({"deadline_s": float("nan")}, "deadline_s"),
        ({"deadline_s": 5e6}, "deadline_s"),
        ({"temperature": "hot"}, "temperature"),
        ({"temperature": True}, "temperature"),
        ({"top_p": [0.5]}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"top_k": 2**32}, "top_k"),
        ({"top_k": 2.0}, "top_k"),
        ({"seed": 2**64}, "seed"),
        ({"seed": -1}, "seed"),
        ({"logprobs": -1}, "logprobs"),
        ({"logprobs": 2**32}, "logprobs"),
        ({"ignore_eos": 1}, "ignore_eos"),
        ({"client_request_id": 7}, "client_request_id"),
        ({"session_id": None}, "session_id"),
        ({"model": b"tiny"}, "model"),
    ],
)
def test_bad_generate_arguments_are_invalid(overrides: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidArgument, match=field):
        gen(**overrides)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("min_p", "x"),
        ("repetition_penalty", "1.1"),
        ("presence_penalty", None),
        ("frequency_penalty", 10**400),
        ("temperature", b"1"),
    ],
)
def test_sampling_params_refuse_what_protobuf_cannot_carry(field: str, value: object) -> None:
    with pytest.raises(InvalidArgument, match=f"^{field}: "):
        SamplingParams(**{field: value})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("overrides", "field", "sent"),
    [
        ({"temperature": -1.0}, "temperature", -1.0),
        ({"top_p": 0.0}, "top_p", 0.0),
        ({"logprobs": 21}, "logprobs", 21),
        ({"top_k": 10**6}, "top_k", 10**6),
    ],
)
def test_values_the_daemon_judges_reach_the_wire_unchanged(overrides: dict[str, Any], field: str, sent: object) -> None:
    # inference.proto documents these ranges and the daemon refuses them with INVALID_ARGUMENT
    # (tests/integration/test_daemon_bad_input.py); the client only checks what protobuf cannot carry.
    pb = gen(**overrides)
    assert getattr(pb.sampling, field) == sent


def test_wait_and_watch_requests() -> None:
    assert wait_request("j", 4).from_event_index == 4
    assert watch_load_request(250).interval_ms == 250
    with pytest.raises(InvalidArgument, match="from_index"):
        wait_request("j", -1)
    with pytest.raises(InvalidArgument, match="interval_ms"):
        watch_load_request(-5)


def test_operation_requests_keep_unset_optionals_unset() -> None:
    load = load_request("a", "p", replace=True, drain_timeout_ms=None, lanes=None)
    assert load.options.replace and not load.options.HasField("drain_timeout_ms") and not load.options.HasField("lanes")
    load = load_request("a", "p", replace=False, drain_timeout_ms=0, lanes=2)
    assert load.options.HasField("drain_timeout_ms") and load.options.drain_timeout_ms == 0 and load.options.lanes == 2
    assert not unload_request("a", None).HasField("drain_timeout_ms")
    assert unload_request("a", 0).HasField("drain_timeout_ms")
    drain = drain_request(None, True)
    assert not drain.HasField("timeout_ms") and drain.interrupt_remaining
    assert drain_request(1500, False).timeout_ms == 1500


@pytest.mark.parametrize(
    "build",
    [
        lambda: load_request("a", "p", replace=False, drain_timeout_ms=-1, lanes=None),
        lambda: load_request("a", "p", replace=False, drain_timeout_ms=None, lanes=2**32),
        lambda: unload_request("a", -1),
        lambda: drain_request(2.5, False),  # type: ignore[arg-type]
    ],
)
def test_unrepresentable_operation_arguments_are_invalid(build: Any) -> None:
    with pytest.raises(InvalidArgument):
        build()


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("ccu", common_pb2.RESET_KIND_CCU),
        ("Configuration", common_pb2.RESET_KIND_CONFIGURATION),
        ("DEVICE", common_pb2.RESET_KIND_DEVICE),
    ],
)
def test_reset_kinds_by_name(name: str, value: int) -> None:
    pb = reset_request(name, "operator test", "")
    assert (pb.kind, pb.reason) == (value, "operator test")


@pytest.mark.parametrize("name", ["", "unspecified", "cpu", "RESET_KIND_CCU"])
def test_unknown_reset_kinds_are_invalid(name: str) -> None:
    with pytest.raises(InvalidArgument, match=r"kind: .*ccu, configuration, device"):
        reset_request(name, "r", "")


def test_fault_requests() -> None:
    pb = inject_fault_request("ccu-exception", job_index=5, probability=None, seed=0, delay_ms=0, clear_existing=True)
    assert pb.clear_existing and pb.fault.kind == operate_pb2.FAULT_KIND_CCU_EXCEPTION
    assert pb.fault.WhichOneof("trigger") == "job_index" and pb.fault.job_index == 5
    pb = inject_fault_request("slow_job", job_index=None, probability=0.25, seed=7, delay_ms=40, clear_existing=False)
    assert pb.fault.WhichOneof("trigger") == "probability" and pb.fault.probability == 0.25
    assert (pb.fault.seed, pb.fault.delay_ms) == (7, 40)
    pb = inject_fault_request(None, job_index=None, probability=None, seed=0, delay_ms=0, clear_existing=True)
    assert pb.clear_existing and not pb.HasField("fault")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"kind": "meltdown", "job_index": 1}, "kind: 'meltdown'"),
        ({"kind": "hang", "job_index": 1, "probability": 0.5}, "at most one"),
        ({"kind": None, "job_index": 1}, "without a fault kind"),
        ({"kind": "hang", "job_index": -1}, "job_index"),
        ({"kind": "hang", "probability": "often"}, "probability"),
        ({"kind": "hang", "job_index": 1, "delay_ms": -5}, "delay_ms"),
        ({"kind": "hang", "job_index": 1, "seed": -1}, "seed"),
    ],
)
def test_bad_fault_specs_are_invalid(kwargs: dict[str, Any], match: str) -> None:
    args: dict[str, Any] = {"job_index": None, "probability": None, "seed": 0, "delay_ms": 0, "clear_existing": False}
    args.update(kwargs)
    with pytest.raises(InvalidArgument, match=match):
        inject_fault_request(args.pop("kind"), **args)


def test_load_outcome() -> None:
    ready = operate_pb2.LoadProgress(state=common_pb2.MODEL_STATE_READY, generation=4, done=True)
    assert load_outcome(ready, "a") is ready
    failed = operate_pb2.LoadProgress(
        state=common_pb2.MODEL_STATE_FAILED,
        done=True,
        error=common_pb2.ErrorStatus(kind=common_pb2.ERROR_KIND_FAILED_PRECONDITION, message="hash mismatch"),
    )
    with pytest.raises(FailedPrecondition, match="hash mismatch"):
        load_outcome(failed, "a")
    busy = operate_pb2.LoadProgress(
        state=common_pb2.MODEL_STATE_FAILED,
        done=True,
        error=common_pb2.ErrorStatus(kind=common_pb2.ERROR_KIND_OVERLOADED, message="no room", retry_after_s=4.0),
    )
    with pytest.raises(Overloaded) as info:
        load_outcome(busy, "a")
    assert info.value.retry_after_s == 4.0
    for unfinished in (None, operate_pb2.LoadProgress(state=common_pb2.MODEL_STATE_WARMING)):
        with pytest.raises(CalculetError, match="ended before its last progress") as err:
            load_outcome(unfinished, "a")
        assert err.value.kind is ErrorKind.INTERNAL
    no_kind = operate_pb2.LoadProgress(state=common_pb2.MODEL_STATE_FAILED, done=True)
    with pytest.raises(CalculetError) as err:
        load_outcome(no_kind, "a")
    assert err.value.kind is ErrorKind.INTERNAL


def test_operation_timeout_adds_the_drain_window() -> None:
    assert operation_timeout(30.0, 2500) == pytest.approx(32.5)
    assert operation_timeout(30.0, None) == pytest.approx(30.0 + MAX_DRAIN_WINDOW_S)


def test_a_switch_reaches_the_wire_and_a_plain_load_has_none() -> None:
    switch = Switch("qwen", 7, force=True, reason="demand", requester="gw-a")
    pb = load_request("dense", "dense0", replace=False, drain_timeout_ms=500, lanes=None, switch=switch)
    o = pb.options
    assert (o.switch_from.alias, o.switch_from.generation, o.force, o.reason, o.requester) == (
        "qwen", 7, True, "demand", "gw-a",
    )  # fmt: skip
    assert o.drain_timeout_ms == 500
    plain = load_request("dense", "dense0", replace=False, drain_timeout_ms=None, lanes=None)
    assert not plain.options.HasField("switch_from") and not plain.options.force


def test_a_switch_generation_outside_uint64_is_invalid() -> None:
    with pytest.raises(InvalidArgument, match=r"switch\.generation"):
        load_request("a", "p", replace=False, drain_timeout_ms=None, lanes=None, switch=Switch("b", -1))
