"""Fuzzing `validate_package` with mutated manifests: a built `tiny` package whose
`calculet-package.json` has random keys replaced by random JSON values or deleted, or whose raw text
carries NaN, Infinity, numbers beyond float range, duplicate keys or broken bytes. Package defects
never raise: the validator always returns a report, and it only says ok for a manifest whose mutation
could not change its meaning (a value replaced by one of another JSON type is always refused)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from calculet.common.errors import InvalidArgument, NotFound
from calculet.daemon.package.manifest import MANIFEST_NAME
from calculet.daemon.package.report import ValidationReport
from calculet.daemon.package.validate import validate_package
from calculet.ops.sim_packages.build import build_sim_package

FUZZ = settings(
    deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture], max_examples=200
)


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A built tiny package (its manifest rewritten by each example) and its original manifest text."""
    root = tmp_path_factory.mktemp("pkg") / "tiny"
    build_sim_package("tiny", root)
    original = (root / MANIFEST_NAME).read_text(encoding="utf-8")
    assert validate_package(root).ok
    return root, original


SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.sampled_from([0, -1, 1, 2**31, 2**53 + 1, 2**63, 2**64, 10**30, -(10**30)]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([0.5, -0.0, 1e300, 1e-300]),
    st.text(max_size=20),
    st.sampled_from(["", "../escape", "/abs", ".", "a" * 5000, "\x00", "🙂"]),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)
# Raw JSON tokens the stdlib writes or reads but strict JSON does not have, and numbers beyond float range.
RAW_TOKENS = st.sampled_from(["NaN", "Infinity", "-Infinity", "1e400", "-1e400", "1" * 400, "1e-400", "-0"])


# Bytes after the whole manifest; JSON whitespace alone would leave it valid.
JUNK_SUFFIX = st.binary(min_size=1, max_size=20).filter(lambda b: b.strip(b" \t\r\n") != b"")


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every key path into `value` (dict keys and list indexes), the root excluded."""
    found: list[tuple[Any, ...]] = []
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, child in items:
        found.append((*prefix, key))
        found.extend(_paths(child, (*prefix, key)))
    return found


def _at(value: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        value = value[key]
    return value


def _kind(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return type(value).__name__
    if isinstance(value, int | float):
        return "number"
    return type(value).__name__


@st.composite
def mutations(draw: st.DrawFn, original: dict[str, Any]) -> tuple[dict[str, Any], list[tuple[str, Any, Any]]]:
    """`original` (a deep copy) with 1-3 keys replaced or deleted; the changes (how, old, new)."""
    doc = json.loads(json.dumps(original))
    changes: list[tuple[str, Any, Any]] = []
    for _ in range(draw(st.integers(1, 3))):
        paths = _paths(doc)
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent, key = _at(doc, path[:-1]), path[-1]
        old = parent[key]
        if draw(st.booleans()):
            new = draw(VALUES)
            parent[key] = new
            changes.append(("replace", old, new))
        else:
            del parent[key]
            changes.append(("delete", old, None))
    return doc, changes


def _validate(root: Path, text: str | bytes) -> ValidationReport:
    path = root / MANIFEST_NAME
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass"))
    report = validate_package(root)
    assert isinstance(report, ValidationReport)
    if not report.ok:
        assert report.problems, "a failed report names at least one problem"
    return report


@FUZZ
@given(data=st.data())
def test_a_mutated_manifest_gets_a_report_never_an_exception(package: tuple[Path, str], data: st.DataObject) -> None:
    root, original_text = package
    original = json.loads(original_text)
    doc, changes = data.draw(mutations(original))
    report = _validate(root, json.dumps(doc))
    if report.ok:
        assert report.manifest is not None
        # A value of another JSON type (a string for a number, a list for a table) changes the meaning:
        # a validator that says ok for it read something the writer never meant. Checked for a single
        # change only: a later change may delete or replace the same key (or its parent) again, and an
        # optional key that is gone is fine.
        if len(changes) == 1:
            how, old, new = changes[0]
            if how == "replace" and old is not None and new is not None:
                assert _kind(old) == _kind(new), f"ok for {old!r} replaced by {new!r}"


@FUZZ
@given(data=st.data(), token=RAW_TOKENS)
@example(data=None, token="NaN")
def test_non_standard_numbers_in_the_raw_text_get_a_report(
    package: tuple[Path, str], data: st.DataObject | None, token: str
) -> None:
    """A number in the manifest text replaced by NaN/Infinity/out-of-range: refused (not ok), not raised."""
    root, original_text = package
    numbers = _number_spans(original_text)
    start, end = numbers[0] if data is None else data.draw(st.sampled_from(numbers))
    text = original_text[:start] + token + original_text[end:]
    report = _validate(root, text)
    if token in ("NaN", "Infinity", "-Infinity", "1e400", "-1e400"):
        assert not report.ok, f"ok with {token} in place of {original_text[start:end]!r}"


def _number_spans(text: str) -> list[tuple[int, int]]:
    return [m.span(1) for m in re.finditer(r":\s*(-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)\s*[,}\]\n]", text)]


@FUZZ
@given(data=st.data())
@example(data=None)
def test_broken_manifest_text_gets_a_report(package: tuple[Path, str], data: st.DataObject | None) -> None:
    root, original_text = package
    if data is None:
        text: str | bytes = original_text[: len(original_text) // 2]
    else:
        text = data.draw(
            st.one_of(
                st.binary(max_size=200),
                st.text(max_size=200),
                st.builds(lambda n: original_text[:n], st.integers(0, len(original_text.rstrip()) - 1)),  # cut short
                st.builds(lambda b: original_text.encode() + b, JUNK_SUFFIX),
                st.sampled_from(["[]", "null", "1", '""', "{}", '{"schema_version": 1, "schema_version": 2}']),
                st.just('{"a": ' * 100_000 + "1" + "}" * 100_000),  # nesting beyond the parser's recursion
            )
        )
    report = _validate(root, text)
    assert not report.ok


def test_the_package_is_valid_again_with_its_original_manifest(package: tuple[Path, str]) -> None:
    root, original_text = package
    assert _validate(root, original_text).ok


def test_a_missing_or_non_directory_package_is_the_documented_error(tmp_path: Path) -> None:
    with pytest.raises(NotFound):
        validate_package(tmp_path / "absent")
    (tmp_path / "file").write_text("x")
    with pytest.raises(InvalidArgument):
        validate_package(tmp_path / "file")
