"""Each request against its reference: exact equality when complete, the prefix rule when cut, and
the failure policy (docs/reliability.md)."""

from __future__ import annotations

from calculet.ops.soak.classify import RequestClass, classify
from calculet.ops.soak.exchange import CUT_DISCONNECT, CUT_TIMEOUT, ExchangeError
from calculet.ops.soak.policy import allowed_rule
from tests.unit.ops.soak.factories import exchange, http_error


def test_a_complete_answer_equal_to_the_reference_is_ok() -> None:
    assert classify(exchange(["abc", "xyz"]), ("abc", "xyz")).cls is RequestClass.OK


def test_a_complete_answer_that_differs_is_crossed_even_in_one_choice_of_n() -> None:
    judged = classify(exchange(["abc", "xyZ"]), ("abc", "xyz"))
    assert judged.cls is RequestClass.CROSSED and "choice 1" in judged.detail


def test_a_complete_answer_that_is_only_a_prefix_is_crossed() -> None:
    assert classify(exchange(["ab"]), ("abc",)).cls is RequestClass.CROSSED


def test_a_disconnected_stream_passes_when_its_text_is_a_prefix() -> None:
    got = exchange(["ab", ""], [None, None], cut=CUT_DISCONNECT)
    assert classify(got, ("abc", "xyz")).cls is RequestClass.CANCELLED


def test_a_disconnected_stream_whose_text_is_no_prefix_is_crossed() -> None:
    got = exchange(["aX"], [None], cut=CUT_DISCONNECT)
    assert classify(got, ("abc",)).cls is RequestClass.CROSSED


def test_a_client_timeout_is_cancelled_and_a_request_that_beat_it_is_compared_whole() -> None:
    assert classify(exchange([""], [None], stream=False, cut=CUT_TIMEOUT), ("abc",)).cls is RequestClass.CANCELLED
    assert classify(exchange(["abd"], stream=False), ("abc",)).cls is RequestClass.CROSSED


def test_a_stream_that_ends_without_finish_reason_is_lost() -> None:
    judged = classify(exchange(["abc", "xy"], ["stop", None]), ("abc", "xyz"))
    assert judged.cls is RequestClass.LOST and "[1]" in judged.detail


def test_a_hang_and_a_broken_connection_are_lost_not_failed() -> None:
    for kind in ("timeout", "connection"):
        got = exchange(["a"], [None], error=ExchangeError(kind, None, None, "gone"))
        assert classify(got, ("abc",)).cls is RequestClass.LOST


def test_failures_are_allowed_by_status_code_or_message_and_others_are_not() -> None:
    assert classify(exchange([""], [None], error=http_error(503)), ("abc",)).allowed_by == "unavailable"
    assert classify(exchange([""], [None], error=http_error(429)), ("abc",)).allowed_by == "overloaded"
    budget = http_error(500, "submit failed: ... (recovery budget exhausted)")
    assert classify(exchange([""], [None], error=budget), ("abc",)).allowed_by == "recovery-budget"
    bad = classify(exchange([""], [None], error=http_error(500, "internal error")), ("abc",))
    assert bad.cls is RequestClass.FAILED and bad.disallowed_failure


def test_an_in_band_error_is_judged_by_its_code_and_its_partial_text_must_be_a_prefix() -> None:
    in_band = ExchangeError("in-band", None, "unavailable", "no board could serve")
    assert classify(exchange(["ab"], [None], error=in_band), ("abc",)).allowed_by == "unavailable"
    assert classify(exchange(["aX"], [None], error=in_band), ("abc",)).cls is RequestClass.CROSSED
    aborted = ExchangeError("in-band", None, "aborted", "kv lost")
    assert classify(exchange(["ab"], [None], error=aborted), ("abc",)).disallowed_failure


def test_a_reference_with_another_number_of_choices_is_crossed() -> None:
    assert classify(exchange(["abc"]), ("abc", "abc")).cls is RequestClass.CROSSED


def test_the_policy_table_names_each_rule() -> None:
    assert allowed_rule(503, None, "x") == "unavailable"
    assert allowed_rule(None, "overloaded", "x") == "overloaded"
    assert allowed_rule(502, None, "x") is None
