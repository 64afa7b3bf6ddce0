"""The reference cache (keyed by the request body, conversations turn by turn), the tally's bounded
examples, and the command's usage errors."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from calculet.common.errors import FailedPrecondition
from calculet.ops import calctl
from calculet.ops.soak.classify import Judgement, RequestClass
from calculet.ops.soak.references import CACHE_SCHEMA, ReferenceBook, body_key
from calculet.ops.soak.tally import MAX_EXAMPLES, Tally
from tests.unit.ops.soak.factories import point, spec


def test_answers_come_from_the_cache_turn_by_turn(tmp_path: Path) -> None:
    conv = spec(("one", "two"), (1, 1))
    first = conv.body("tiny", 0, ())
    second = conv.body("tiny", 1, ("A1",))
    cache = tmp_path / "references.json"
    cache.write_text(json.dumps({"schema": CACHE_SCHEMA, "answers": {body_key(first): ["A1"]}}))
    book = ReferenceBook(cache)
    assert book.missing([conv], "tiny") == 1  # the second turn, once the first is known
    with pytest.raises(FailedPrecondition):
        asyncio.run(book.fill([conv], None, "tiny"))
    both = {body_key(first): ["A1"], body_key(second): ["A2"]}
    cache.write_text(json.dumps({"schema": CACHE_SCHEMA, "answers": both}))
    book = ReferenceBook(cache)
    assert book.missing([conv], "tiny") == 0
    asyncio.run(book.fill([conv], None, "tiny"))
    assert book.answers(conv) == (("A1",), ("A2",)) and book.asked == 0


def test_a_cache_of_another_schema_is_ignored(tmp_path: Path) -> None:
    cache = tmp_path / "references.json"
    cache.write_text(json.dumps({"schema": "other", "answers": {body_key(spec().body("tiny", 0, ())): ["x"]}}))
    assert ReferenceBook(cache).missing([spec()], "tiny") == 1


def test_the_body_key_does_not_depend_on_key_order() -> None:
    assert body_key({"a": 1, "b": [1, 2]}) == body_key({"b": [1, 2], "a": 1})


def test_the_tally_counts_everything_but_keeps_a_bounded_set_of_examples() -> None:
    t = Tally()
    for _ in range(MAX_EXAMPLES + 5):
        t.add(point(1.0, RequestClass.FAILED), Judgement(RequestClass.FAILED, "unavailable", "503"), "soak-1", 0)
        t.add(point(1.0, RequestClass.FAILED), Judgement(RequestClass.FAILED, None, "500"), "soak-2", 0)
    t.add(point(1.0), Judgement(RequestClass.OK), "soak-3", 0)
    doc = t.to_json()
    assert doc["by_class"]["failed"] == 2 * (MAX_EXAMPLES + 5) and doc["failed_disallowed"] == MAX_EXAMPLES + 5
    assert len(doc["examples"]) == 2 * MAX_EXAMPLES
    assert doc["failed_allowed_by_rule"] == {"unavailable": MAX_EXAMPLES + 5}


@pytest.mark.parametrize(
    "argv",
    [
        ["soak", "--out", "x"],
        ["soak", "--duration", "0s", "--out", "x"],
        ["soak", "--duration", "2m", "--out", "x", "--load", "0"],
        ["soak", "--duration", "2m", "--out", "x", "--preset", "nope"],
        ["soak", "--duration", "2m", "--out", "x", "--pool", "3"],
    ],
)
def test_bad_flags_are_usage_errors(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        calctl.main(argv)
    assert stop.value.code == 2
