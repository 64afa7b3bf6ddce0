"""Constraints on the wire: every form round-trips between the client's `Constraint`, the protobuf
and the daemon's domain `Constraint` (the gateway builds on the client's); malformed ones and ones
over the size bounds are refused naming the field, before anything is compiled."""

from __future__ import annotations

import pytest

from calculet.client import Constraint as ClientConstraint
from calculet.client import SamplingParams as ClientSampling
from calculet.client import convert
from calculet.common.errors import InvalidArgument
from calculet.daemon import wire
from calculet.daemon.sampling.constraint import MAX_CHOICES, MAX_GRAMMAR_BYTES, Constraint, ConstraintKind
from calculet.daemon.server.checks import constraint_sizes
from calculet.v1 import inference_pb2

FORMS = [
    (
        ClientConstraint.of_json_schema({"type": "integer"}),
        Constraint(ConstraintKind.JSON_SCHEMA, '{"type": "integer"}'),
    ),
    (ClientConstraint.of_json_object(), Constraint(ConstraintKind.JSON_OBJECT)),
    (ClientConstraint.of_regex("[a-z]+"), Constraint(ConstraintKind.REGEX, "[a-z]+")),
    (ClientConstraint.of_choice(["yes", "no", "é"]), Constraint(ConstraintKind.CHOICE, choices=("yes", "no", "é"))),
    (ClientConstraint.of_lark('start: "a"+'), Constraint(ConstraintKind.LARK, 'start: "a"+')),
]


@pytest.mark.parametrize(("client", "domain"), FORMS)
def test_every_form_round_trips_client_wire_daemon(client: ClientConstraint, domain: Constraint) -> None:
    pb = convert.sampling_to_pb(ClientSampling(seed=3, constraint=client))
    constraint_sizes(pb)
    daemon_side = wire.sampling_from_pb(pb)
    assert daemon_side.constraint == domain
    back = wire.sampling_to_pb(daemon_side)
    assert back.constraint == pb.constraint
    assert convert.sampling_from_pb(back).constraint == client


def test_no_constraint_stays_none_on_both_sides() -> None:
    pb = convert.sampling_to_pb(ClientSampling(seed=1))
    assert not pb.HasField("constraint")
    assert wire.sampling_from_pb(pb).constraint is None
    assert convert.sampling_from_pb(pb).constraint is None


@pytest.mark.parametrize(
    ("pb", "message"),
    [
        (inference_pb2.Constraint(), r"^constraint: set one of"),
        (inference_pb2.Constraint(json_object=False), r"^constraint.json_object: must be true"),
        (inference_pb2.Constraint(regex=""), r"^constraint.regex: must not be empty"),
        (inference_pb2.Constraint(choice=inference_pb2.ConstraintChoice()), r"^constraint.choice: at least one"),
    ],
)
def test_a_malformed_constraint_is_refused_naming_the_field(pb: inference_pb2.Constraint, message: str) -> None:
    sampling = inference_pb2.SamplingParams(constraint=pb)
    with pytest.raises(InvalidArgument, match=message):
        wire.sampling_from_pb(sampling)


@pytest.mark.parametrize(
    ("pb", "message"),
    [
        (inference_pb2.Constraint(lark="x" * (MAX_GRAMMAR_BYTES + 1)), r"^constraint\.lark: at most 65536 bytes"),
        (
            inference_pb2.Constraint(json_schema="é" * (MAX_GRAMMAR_BYTES // 2 + 1)),
            r"^constraint\.json_schema: at most",
        ),
        (
            inference_pb2.Constraint(choice=inference_pb2.ConstraintChoice(options=["a"] * (MAX_CHOICES + 1))),
            r"^constraint\.choice: at most 256 choices",
        ),
        (
            inference_pb2.Constraint(choice=inference_pb2.ConstraintChoice(options=["x" * 40_000, "y" * 40_000])),
            r"^constraint\.choice: at most 65536 bytes",
        ),
    ],
)
def test_sizes_over_the_bounds_are_refused_before_conversion(pb: inference_pb2.Constraint, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        constraint_sizes(inference_pb2.SamplingParams(constraint=pb))


def test_the_client_checks_the_shape_only() -> None:
    for bad in (lambda: ClientConstraint("sql", "x"), lambda: ClientConstraint.of_choice([]),
                lambda: ClientConstraint("regex"), lambda: ClientConstraint("json_object", "x")):  # fmt: skip
        with pytest.raises(InvalidArgument, match=r"^constraint"):
            bad()
    with pytest.raises(InvalidArgument, match=r"^constraint: must be a calculet\.client\.Constraint"):
        ClientSampling(constraint="[a-z]+")  # type: ignore[arg-type]
