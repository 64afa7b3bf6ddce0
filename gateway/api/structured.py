"""Structured outputs: the request fields that constrain an answer, as one `Constraint` for the
boards (docs/gateway.md "Structured outputs"; the daemon enforces it token by token, docs/daemon.md
"Constrained decoding").

- OpenAI's `response_format` (chat): `text` (no constraint), `json_object` (any JSON object) and
  `json_schema` (`{"name", "schema", "strict", "description"}`): the answer matches the schema,
  strict or not (a non-strict schema is enforced all the same: the model cannot stray from it).
- vLLM's `structured_outputs` extension (chat and text completions, through the official client's
  `extra_body`): exactly one of `json` (a schema), `json_object`, `regex`, `choice` or `grammar`
  (llguidance's Lark dialect).

The gateway checks shapes only; the board compiles the constraint with the package's tokenizer and
refuses a schema, regex or grammar it cannot compile with a 400 that names the part
("constraint.json_schema: ..."). vLLM's older `guided_*` fields stay refused, naming this one.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import orjson
from pydantic import Field, field_validator, model_validator

from calculet.client import Constraint
from calculet.common.errors import InvalidArgument
from calculet.gateway.api.lenient import Lenient

MAX_CHOICES = 256  # the daemon's bound on a choice constraint's options


class JsonSchemaFormat(Lenient):
    """`response_format.json_schema`."""

    name: Annotated[str, Field(min_length=1, max_length=64)] | None = None
    description: str | None = None
    schema_: dict[str, Any] = Field(alias="schema")
    strict: bool | None = None


class ResponseFormat(Lenient):
    """OpenAI's `response_format`."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("type 'json_schema' needs a `json_schema` object with its `schema`")
        return self

    def constraint(self) -> Constraint | None:
        if self.type == "json_object":
            return Constraint.of_json_object()
        if self.type == "json_schema" and self.json_schema is not None:
            return Constraint.of_json_schema(orjson.dumps(self.json_schema.schema_).decode())
        return None


class StructuredOutputs(Lenient):
    """vLLM's `structured_outputs`: exactly one form."""

    json_: dict[str, Any] | str | None = Field(default=None, alias="json")
    json_object: bool | None = None
    regex: Annotated[str, Field(min_length=1)] | None = None
    choice: Annotated[list[str], Field(min_length=1, max_length=MAX_CHOICES)] | None = None
    grammar: Annotated[str, Field(min_length=1)] | None = None

    @model_validator(mode="after")
    def _one_form(self) -> StructuredOutputs:
        given = [name for name in ("json", "json_object", "regex", "choice", "grammar") if self._value(name)]
        if len(given) != 1:
            raise ValueError(f"give exactly one of json, json_object, regex, choice, grammar (got {given or 'none'})")
        return self

    def _value(self, name: str) -> Any:
        return {"json": self.json_, "json_object": self.json_object}.get(name, getattr(self, name, None))

    def constraint(self) -> Constraint:
        if self.json_ is not None:
            text = self.json_ if isinstance(self.json_, str) else orjson.dumps(self.json_).decode()
            return Constraint.of_json_schema(text)
        if self.json_object:
            return Constraint.of_json_object()
        if self.regex is not None:
            return Constraint.of_regex(self.regex)
        if self.choice is not None:
            return Constraint.of_choice(self.choice)
        assert self.grammar is not None  # _one_form
        return Constraint.of_lark(self.grammar)


class StructuredFields(Lenient):
    """The constraining fields of a request (chat and text completions)."""

    structured_outputs: StructuredOutputs | None = None

    @field_validator("structured_outputs", mode="before")
    @classmethod
    def _object(cls, value: Any) -> Any:
        if value is not None and not isinstance(value, dict):
            raise ValueError("must be an object with one of json, json_object, regex, choice, grammar")
        return value

    def constraint(self, response_format: ResponseFormat | None = None) -> Constraint | None:
        """The one constraint the request asks for, or None.

        Raises:
            InvalidArgument: both `response_format` (not text) and `structured_outputs` are given.
        """
        from_format = response_format.constraint() if response_format is not None else None
        if from_format is not None and self.structured_outputs is not None:
            raise InvalidArgument("response_format, structured_outputs: give one of them")
        if self.structured_outputs is not None:
            return self.structured_outputs.constraint()
        return from_format
