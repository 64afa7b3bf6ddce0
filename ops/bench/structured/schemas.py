"""Bounded JSON schemas and tool sets for the structured-output and tool-call benchmarks, drawn from
a seeded `random.Random` (docs/benchmarking.md "Structured outputs and tools").

Every schema is bounded: enums, strings with `maxLength`, integers and numbers with both bounds,
arrays with `maxItems`, objects nested at most twice with `additionalProperties: false` and some
fields optional. So an answer that follows the grammar, whatever the model, ends within a few
hundred tokens (a free string or an open object may never close under a random model: that is
correct behaviour, and not what a validity figure should measure). A tool set is one to three
functions whose `parameters` are such objects.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import random
from typing import Any

from calculet.common.errors import FailedPrecondition

Json = dict[str, Any]
WORDS = ("alpha", "beta", "gamma", "delta", "red", "green", "blue", "north", "south", "yes", "no", "maybe")


def scalar_schema(rng: random.Random) -> Json:
    """An enum, a bounded string, integer or number, or a boolean."""
    kind = rng.choice(["enum", "string", "integer", "number", "boolean"])
    if kind == "enum":
        return {"enum": rng.sample(WORDS, rng.randint(2, 5))}
    if kind == "string":
        return {"type": "string", "maxLength": rng.randint(1, 16)}
    if kind == "integer":
        low = rng.randint(-1000, 100)
        return {"type": "integer", "minimum": low, "maximum": low + rng.randint(1, 5000)}
    if kind == "number":
        return {"type": "number", "minimum": -100, "maximum": 100}
    return {"type": "boolean"}


def value_schema(rng: random.Random, depth: int) -> Json:
    """A scalar, a bounded array of scalars, or (above depth 2) a nested object."""
    pick = rng.random()
    if pick < 0.15:
        return {"type": "array", "items": scalar_schema(rng), "maxItems": rng.randint(1, 4)}
    if pick < 0.3 and depth < 2:
        return object_schema(rng, depth + 1)
    return scalar_schema(rng)


def object_schema(rng: random.Random, depth: int = 0) -> Json:
    """An object of one to five fields (three when nested), about 70 % of them required."""
    names = [f"f{i}_{rng.choice(WORDS)}" for i in range(rng.randint(1, 5 if depth == 0 else 3))]
    props = {name: value_schema(rng, depth) for name in names}
    required = [n for n in names if rng.random() < 0.7]  # the rest are optional
    return {"type": "object", "properties": props, "required": required, "additionalProperties": False}


def tool_set(rng: random.Random) -> list[Json]:
    """One to three chat tools (`tool_0`, ...), each with an `object_schema` as its parameters."""
    return [
        {
            "type": "function",
            "function": {"name": f"tool_{k}", "description": f"tool {k}", "parameters": object_schema(rng)},
        }
        for k in range(rng.randint(1, 3))
    ]


def response_format(schema: Json, name: str = "out") -> Json:
    """OpenAI's `response_format` for `schema`, strict."""
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


def require_jsonschema() -> None:
    """Raises: FailedPrecondition: jsonschema, which checks the answers, is not installed."""
    if importlib.util.find_spec("jsonschema") is None:
        raise FailedPrecondition(
            "--workload structured|tools checks answers with jsonschema: pip install 'calculet[bench]'"
        )


def validates(value: Any, schema: Json) -> bool:
    """Whether `value` (parsed JSON) validates against `schema` (`require_jsonschema` first)."""
    jsonschema = importlib.import_module("jsonschema")
    try:
        jsonschema.validate(value, schema)
    except jsonschema.ValidationError:
        return False
    return True


def parsed(text: str | None) -> tuple[bool, Any]:
    """(True, the value) when `text` is JSON, else (False, None)."""
    try:
        return True, json.loads(text or "")
    except ValueError:
        return False, None
