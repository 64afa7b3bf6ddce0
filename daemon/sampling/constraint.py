"""A request's output constraint, in domain form (docs/daemon.md "Constrained decoding").

`Constraint` is what a Submit's `SamplingParams.constraint` carries once the wire module converted
it: exactly one of a JSON schema, any JSON object, a regex, a choice among strings, or a Lark
grammar. It is plain data (hashable: the compile cache keys on it); the grammar package
(`calculet.daemon.grammar`) compiles it with llguidance and enforces it token by token.

Sizes are bounded so a request cannot make the daemon compile without limit: `check_sizes` is the
transport's check (`server/checks.py`), made before anything is compiled.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from calculet.common.errors import InvalidArgument

MAX_GRAMMAR_BYTES = 64 * 1024  # a schema, regex or grammar (UTF-8), and all choices together
MAX_CHOICES = 256


class ConstraintKind(Enum):
    JSON_SCHEMA = "json_schema"  # `text`: a JSON schema (a JSON document)
    JSON_OBJECT = "json_object"  # any JSON object; `text` is empty
    REGEX = "regex"  # `text`: a regular expression the whole output matches
    CHOICE = "choice"  # `choices`: the output is exactly one of them
    LARK = "lark"  # `text`: a Lark grammar (llguidance's dialect) whose start rule the output matches


@dataclass(frozen=True, slots=True)
class Constraint:
    """What the output of a constrained request must match.

    Attributes:
        kind: which form.
        text: the schema, regex or grammar ("" for JSON_OBJECT and CHOICE).
        choices: the strings of a CHOICE (non-empty), else ().

    Raises (on construction):
        InvalidArgument: `text`/`choices` do not fit `kind`; the message names the field.
    """

    kind: ConstraintKind
    text: str = ""
    choices: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        name = f"constraint.{self.kind.value}"
        if self.kind is ConstraintKind.CHOICE:
            if not self.choices or self.text:
                raise InvalidArgument(f"{name}: at least one string, and no text")
        elif self.choices:
            raise InvalidArgument(f"{name}: takes no choices")
        elif self.kind is not ConstraintKind.JSON_OBJECT and not self.text:
            raise InvalidArgument(f"{name}: must not be empty")

    @property
    def field(self) -> str:
        """The field name errors about it start with, e.g. `constraint.json_schema`."""
        return f"constraint.{self.kind.value}"


def check_sizes(kind: str, text: str, choices: Sequence[str]) -> None:
    """The size bounds, on the raw fields before a `Constraint` is built.

    Args:
        kind: the field's name (`json_schema`, `regex`, `choice`, `lark`, ...).
        text / choices: its content.

    Raises:
        InvalidArgument: over MAX_GRAMMAR_BYTES or MAX_CHOICES; the message names the field.
    """
    if len(choices) > MAX_CHOICES:
        raise InvalidArgument(f"constraint.{kind}: at most {MAX_CHOICES} choices, got {len(choices)}")
    size = len(text.encode()) + sum(len(c.encode()) for c in choices)
    if size > MAX_GRAMMAR_BYTES:
        raise InvalidArgument(f"constraint.{kind}: at most {MAX_GRAMMAR_BYTES} bytes, got {size}")
