"""Constrained decoding through a real daemon process over gRPC (docs/daemon.md "Constrained
decoding"): a JSON-schema-constrained Submit streams JSON that validates and ends STOP; a Submit
with a broken schema is INVALID_ARGUMENT naming the field, and the board still serves afterwards."""

from __future__ import annotations

import json

import jsonschema
import pytest
from tokenizers import Tokenizer

from calculet.client import (
    Constraint,
    DaemonClient,
    FinalEvent,
    FinishReason,
    InvalidArgument,
    SamplingParams,
    TokenChunk,
)

pytestmark = pytest.mark.integration

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 6},
        "temp": {"type": "integer", "minimum": -50, "maximum": 50},
    },
    "required": ["city", "temp"],
    "additionalProperties": False,
}


def test_a_json_schema_request_validates_and_a_broken_schema_is_invalid_argument(start_daemon) -> None:
    daemon = start_daemon("--model", "tiny=tiny")
    with DaemonClient(daemon.target) as c:
        tok = Tokenizer.from_str(c.get_model("tiny").tokenizer_json.decode())
        for seed in range(4):
            sampling = SamplingParams(seed=seed, temperature=1.0, constraint=Constraint.of_json_schema(SCHEMA))
            job = c.submit("tiny", (5, 6, 7), sampling=sampling, max_tokens=100).job_id
            events = list(c.wait(job))
            final = events[-1]
            assert isinstance(final, FinalEvent) and final.reason is FinishReason.STOP, final
            tokens = [t for e in events if isinstance(e, TokenChunk) for t in e.tokens]
            jsonschema.validate(json.loads(tok.decode(tokens, skip_special_tokens=True)), SCHEMA)
        broken = SamplingParams(seed=1, constraint=Constraint.of_json_schema('{"type": "objx"}'))
        with pytest.raises(InvalidArgument, match=r"constraint\.json_schema"):
            c.submit("tiny", (5, 6, 7), sampling=broken, max_tokens=10)
        counters = c.status().job_counters  # the refusal queued nothing
        assert (counters.accepted, counters.rejected, counters.completed) == (4, 1, 4)
        assert c.status().inflight_submissions == 0
        again = c.submit("tiny", (5, 6, 7), sampling=SamplingParams(seed=2), max_tokens=5).job_id
        final = list(c.wait(again))[-1]
        assert isinstance(final, FinalEvent) and final.reason is FinishReason.LENGTH
