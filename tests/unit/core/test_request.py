"""Request validation: every invalid request is refused with a message naming the field."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from calculet.common.errors import InvalidArgument
from calculet.daemon.core.request import GenerationRequest, ModelLimits, StoppingParams, validate_request
from calculet.daemon.sampling.params import SamplingParams

LIMITS = ModelLimits(vocab_size=512, context=256, prefill_tokens=256, eos_token_ids=frozenset({2}))


def req(prompt=(1, 2, 3), max_tokens=8, resume=(), stop=(), deadline=None) -> GenerationRequest:
    return GenerationRequest(
        "tiny", tuple(prompt), SamplingParams(), StoppingParams(max_tokens, tuple(stop)), "", tuple(resume), 0, deadline
    )


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (req(prompt=()), "prompt_tokens"),
        (req(prompt=(1, 512)), "prompt_tokens[1]"),
        (req(prompt=(-1,)), "prompt_tokens[0]"),
        (req(resume=(600,)), "resume_tokens[0]"),
        (req(stop=(512,)), "stop_token_ids[0]"),
        (req(max_tokens=0), "max_tokens"),
        (req(max_tokens=257), "max_tokens"),
        (req(max_tokens=3, resume=(1, 2, 3)), "resume_tokens"),
        (req(prompt=(1,) * 250, max_tokens=7), "prompt_tokens + max_tokens"),
        (req(deadline=0.0), "deadline"),
        (req(resume=(5, 2, 7)), "resume_tokens[1]"),  # EOS: the earlier attempt had finished
        (req(resume=(5, 9), stop=(9,)), "resume_tokens[1]"),
    ],
)
def test_invalid_request_names_the_field(request_: GenerationRequest, field: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        validate_request(request_, LIMITS)
    assert str(info.value).startswith(field)


@given(
    prompt_len=st.integers(1, 256),
    max_tokens=st.integers(1, 256),
    resumed=st.integers(0, 255),
    token=st.integers(3, 511),
)
def test_valid_iff_it_fits_the_context(prompt_len: int, max_tokens: int, resumed: int, token: int) -> None:
    r = req(prompt=(token,) * prompt_len, max_tokens=max_tokens, resume=(token,) * resumed)
    fits = prompt_len + max_tokens <= 256 and resumed < max_tokens and prompt_len + resumed <= 256
    if fits:
        validate_request(r, LIMITS)
    else:
        with pytest.raises(InvalidArgument):
            validate_request(r, LIMITS)
