"""SamplingParams validation: every invalid value is refused naming its field, every valid one accepted."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from calculet.common.errors import ErrorKind, InvalidArgument
from calculet.daemon.sampling import SamplingParams
from calculet.daemon.sampling.params import MAX_LOGPROBS, MAX_SEED, MAX_TEMPERATURE

VOCAB = 1000

NOT_FINITE = st.sampled_from([math.nan, math.inf, -math.inf])
NOT_A_NUMBER = st.sampled_from([True, False, "1", None, (1,)])
NOT_AN_INT = st.sampled_from([True, False, 1.0, 0.5, "3", None])

INVALID: dict[str, st.SearchStrategy[object]] = {
    "seed": st.integers(max_value=-1) | st.integers(min_value=MAX_SEED + 1) | NOT_AN_INT,
    "temperature": st.floats(max_value=-1e-300)
    | st.floats(min_value=MAX_TEMPERATURE * 1.0001)
    | NOT_FINITE
    | NOT_A_NUMBER,
    "top_k": st.integers(max_value=-1) | st.integers(min_value=VOCAB + 1) | NOT_AN_INT,
    "top_p": st.floats(max_value=0.0) | st.floats(min_value=1.0, exclude_min=True) | NOT_FINITE | NOT_A_NUMBER,
    "min_p": st.floats(max_value=-1e-300) | st.floats(min_value=1.0) | NOT_FINITE | NOT_A_NUMBER,
    "repetition_penalty": st.floats(max_value=0.0) | NOT_FINITE | NOT_A_NUMBER,
    "presence_penalty": st.floats(min_value=2.0, exclude_min=True)
    | st.floats(max_value=-2.0, exclude_max=True)
    | NOT_FINITE
    | NOT_A_NUMBER,
    "frequency_penalty": st.floats(min_value=2.0, exclude_min=True)
    | st.floats(max_value=-2.0, exclude_max=True)
    | NOT_FINITE
    | NOT_A_NUMBER,
    "logprobs": st.integers(max_value=-1)
    | st.integers(min_value=MAX_LOGPROBS + 1)
    | NOT_AN_INT.filter(lambda v: v is not None),
}


@given(st.sampled_from(sorted(INVALID)).flatmap(lambda f: st.tuples(st.just(f), INVALID[f])))
def test_every_invalid_value_is_refused_naming_the_field(case: tuple[str, object]) -> None:
    field, value = case
    with pytest.raises(InvalidArgument) as err:
        SamplingParams(**{field: value}).validate(VOCAB)  # type: ignore[arg-type]
    assert err.value.kind is ErrorKind.INVALID_ARGUMENT
    assert str(err.value).startswith(f"{field}:")


VALID = st.fixed_dictionaries(
    {
        "seed": st.integers(0, MAX_SEED),
        "temperature": st.floats(0.0, MAX_TEMPERATURE),
        "top_k": st.integers(0, VOCAB),
        "top_p": st.floats(0.0, 1.0, exclude_min=True),
        "min_p": st.floats(0.0, 1.0, exclude_max=True),
        "repetition_penalty": st.floats(0.0, 1e6, exclude_min=True),
        "presence_penalty": st.floats(-2.0, 2.0),
        "frequency_penalty": st.floats(-2.0, 2.0),
        "logprobs": st.none() | st.integers(0, MAX_LOGPROBS),
    }
)


@given(VALID)
def test_every_valid_combination_is_accepted_unchanged(fields: dict[str, object]) -> None:
    params = SamplingParams(**fields)  # type: ignore[arg-type]
    params.validate(VOCAB)
    for name, value in fields.items():
        assert getattr(params, name) == value


def test_top_k_up_to_the_vocabulary_is_valid_and_beyond_it_is_refused_by_validate() -> None:
    SamplingParams(top_k=VOCAB).validate(VOCAB)
    params = SamplingParams(top_k=VOCAB + 1)  # vocabulary-independent checks pass on construction
    with pytest.raises(InvalidArgument, match=r"^top_k: .*vocabulary size 1000"):
        params.validate(VOCAB)


def test_greedy_means_temperature_below_the_epsilon() -> None:
    assert SamplingParams(temperature=0.0).greedy
    assert SamplingParams(temperature=1e-6).greedy
    assert not SamplingParams(temperature=1e-4).greedy


def test_params_are_frozen() -> None:
    params = SamplingParams()
    with pytest.raises(AttributeError):
        params.top_k = 3  # type: ignore[misc]
