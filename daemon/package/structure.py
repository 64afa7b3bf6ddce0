"""Structural check of the raw manifest JSON against the schema v1 dataclasses, every problem at once.

This module owns the question "does this JSON have the shape `PackageManifest.from_dict` reads?".
The expected shape is not written twice: it is read from the type hints of the manifest
dataclasses (`bool`, `int`, `float`, `str`, `T | None`, `tuple[T, ...]`, `tuple[A, B]`, `dict[str, str]`,
nested dataclasses; fields with defaults are optional), so a field added to the dataclasses is
checked here without an edit. Findings go to the caller's `Findings` as `schema.*` codes, plus
`value.range` for numbers no field can hold (NaN, infinities, integers beyond 64 bits), which
JSON's grammar or the board's registers exclude; `unrepresentable` counts those, and a manifest
with any is not parsed (no later check computes with them).
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Mapping
from typing import Any

from calculet.daemon.package.manifest import INT64_MAX, INT64_MIN, PackageManifest
from calculet.daemon.package.report import Findings


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _expected(tp: Any) -> str:
    """Human name of a type hint, for messages."""
    if tp is bool:
        return "true or false"
    if tp is int:
        return "an integer"
    if tp is float:
        return "a number"
    if tp is str:
        return "a string"
    origin = typing.get_origin(tp)
    if origin in (types.UnionType, typing.Union):
        return " or ".join("null" if a is type(None) else _expected(a) for a in typing.get_args(tp))
    if origin is tuple:
        return "an array"
    return "an object"


class StructureChecker:
    """Walks raw JSON beside the dataclass type hints, adding `schema.*` findings.

    Args:
        findings: collector owned by the caller.
    """

    def __init__(self, findings: Findings) -> None:
        self.findings = findings
        self.unrepresentable = 0  # numbers reported as value.range by this walk

    def check_manifest(self, raw: Mapping[str, Any]) -> None:
        self.check(raw, PackageManifest, "manifest")

    def check(self, value: Any, tp: Any, where: str) -> None:
        if dataclasses.is_dataclass(tp):
            self._dataclass(value, typing.cast(type, tp), where)
            return
        origin = typing.get_origin(tp)
        if origin in (types.UnionType, typing.Union):
            args = typing.get_args(tp)
            if value is None and type(None) in args:
                return
            inner = [a for a in args if a is not type(None)]
            self.check(value, inner[0], where)
            return
        if origin is tuple:
            self._tuple(value, tp, where)
            return
        if origin is dict:
            self._strmap(value, where)
            return
        if not self._scalar_ok(value, tp):
            self._wrong(where, tp, value)
        elif tp in (int, float):
            self._representable(value, where)

    def _representable(self, value: int | float, where: str) -> None:
        """Report (value.range) a number of the right JSON type that no field can hold."""
        if isinstance(value, float) and not math.isfinite(value):
            problem = f"must be a finite number, got {value}"
        elif isinstance(value, int) and not INT64_MIN <= value <= INT64_MAX:
            problem = f"an integer of {len(str(abs(value)))} digits does not fit in 64 bits"
        else:
            return
        self.unrepresentable += 1
        self.findings.add("value.range", where, problem)

    @staticmethod
    def _scalar_ok(value: Any, tp: Any) -> bool:
        if tp is bool:
            return isinstance(value, bool)
        if isinstance(value, bool):
            return False
        if tp is int:
            return isinstance(value, int)
        if tp is float:
            return isinstance(value, int | float)
        if tp is str:
            return isinstance(value, str)
        return True  # Any or an unmodelled hint: accept what from_dict accepts

    def _wrong(self, where: str, tp: Any, value: Any) -> None:
        self.findings.add("schema.wrong_type", where, f"expected {_expected(tp)}, got {_json_type(value)}")

    def _dataclass(self, value: Any, cls: type, where: str) -> None:
        if not isinstance(value, Mapping):
            self.findings.add("schema.wrong_type", where, f"expected an object, got {_json_type(value)}")
            return
        hints = typing.get_type_hints(cls)
        names = set()
        for f in dataclasses.fields(cls):
            names.add(f.name)
            optional = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
            if f.name not in value:
                if not optional:
                    self.findings.add("schema.missing_field", f"{where}.{f.name}", "required field is missing")
                continue
            self.check(value[f.name], hints[f.name], f"{where}.{f.name}")
        for key in value:
            if key not in names:
                self.findings.add("schema.unknown_field", f"{where}.{key}", f"schema v1 has no field {key!r}; ignored")

    def _tuple(self, value: Any, tp: Any, where: str) -> None:
        if not isinstance(value, list):
            self._wrong(where, tp, value)
            return
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            for i, item in enumerate(value):
                self.check(item, args[0], f"{where}[{i}]")
            return
        if len(value) != len(args):
            self.findings.add("schema.wrong_type", where, f"expected an array of {len(args)} items, got {len(value)}")
            return
        for i, (item, arg) in enumerate(zip(value, args, strict=True)):
            self.check(item, arg, f"{where}[{i}]")

    def _strmap(self, value: Any, where: str) -> None:
        if not isinstance(value, Mapping):
            self.findings.add("schema.wrong_type", where, f"expected an object of strings, got {_json_type(value)}")
            return
        for key, item in value.items():
            if not isinstance(item, str):
                self.findings.add("schema.wrong_type", f"{where}.{key}", f"expected a string, got {_json_type(item)}")
