"""Names and anchored patterns (issue 7, item 7 and the regex sweep): every pattern that validates a
whole string must match the whole string. `re.match(r"...$")` accepts a trailing newline (`$`
matches before it) and `\\d` accepts any Unicode digit; model aliases, SHA-256 digests, versions
and daemon targets must refuse both."""

from __future__ import annotations

from pathlib import Path

import pytest

from calculet.client.channel import parse_target
from calculet.common.aliases import check_alias
from calculet.common.errors import InvalidArgument
from calculet.daemon.package.manifest import MANIFEST_NAME
from calculet.daemon.package.validate import validate_package
from calculet.daemon.package.versions import in_range, parse_range, parse_version, release_part
from calculet.ops.sim_packages.build import build_sim_package
from tests.unit.core.engine_factories import running_core

from .conftest import PackageFactory

BAD_ALIASES = [
    "evil\n",
    "evil\r\n",
    "evil\r",
    "evil\x00",
    "evil\t",
    "evil\x0b",
    "evil ",
    "\nevil",
    " evil",
    "\x1bevil",
    "ev\nil",
    "evil\u2028",
    "\u0661evil",  # ARABIC-INDIC DIGIT ONE is not an ASCII digit
    "évil",
    "",
    "-evil",
    "a" * 129,
]
GOOD_ALIASES = ["a", "0", "a" * 128, "org/model:v1.2_x-y", "Qwen3-30B-A3B"]


@pytest.mark.parametrize("alias", BAD_ALIASES, ids=repr)
def test_check_alias_refuses_control_characters_and_outsiders(alias: str) -> None:
    with pytest.raises(InvalidArgument, match="alias"):
        check_alias(alias)


@pytest.mark.parametrize("alias", GOOD_ALIASES)
def test_check_alias_accepts_the_documented_alphabet(alias: str) -> None:
    check_alias(alias)


@pytest.fixture(scope="module")
def tiny_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("models")
    build_sim_package("tiny", root / "tiny")
    return root


def test_the_daemon_refuses_aliases_with_control_characters_and_publishes_none(tiny_root: Path) -> None:
    with running_core(tiny_root) as core:
        for alias in ("evil\n", "evil\r\n", "\nevil", "evil\x00"):
            with pytest.raises(InvalidArgument, match="alias"):
                core.load(alias, "tiny")
        assert [rt.alias for rt in core.models.all()] == ["tiny"], "nothing was loaded or published"
        assert core.models.published("evil") is None and core.models.published("evil\n") is None


# ---------------------------------------------------------------- the sweep


def test_a_sha256_with_a_trailing_newline_is_malformed_even_without_hashing(factory: PackageFactory) -> None:
    """`files.sha256` must be exactly 64 lowercase hex digits; with --skip-hashes nothing else looks."""
    root = factory.write()
    factory.edit(root, lambda raw: raw["files"][0].__setitem__("sha256", raw["files"][0]["sha256"] + "\n"))
    report = validate_package(root, verify_hashes=False)
    assert report.codes == ["file.hash"], report.render_text()
    assert "64 lowercase hex" in report.problems[0].message


@pytest.mark.parametrize("text", ["0.7.6\n0", "\u0660.7.6", "0.\uff17.6", "0.7.6\x00"], ids=repr)
def test_versions_are_ascii_dotted_integers_only(text: str) -> None:
    with pytest.raises(InvalidArgument):
        parse_version(text)


@pytest.mark.parametrize("spec", [">=\u0660.7.6", ">=0.7.6\n<0.8", ">=0.7.6 ,<0.8\n\n\n\u0668"], ids=repr)
def test_version_ranges_refuse_non_ascii_digits_and_embedded_newlines(spec: str) -> None:
    with pytest.raises(InvalidArgument):
        parse_range(spec)


@pytest.mark.parametrize("text", ["\u0660.7.6", "0.7.6\nextra", "v0.7.6"], ids=repr)
def test_release_part_needs_ascii_dotted_integers_at_the_start(text: str) -> None:
    with pytest.raises(InvalidArgument):
        release_part(text)


def test_release_part_and_ranges_still_read_what_they_documented() -> None:
    assert release_part("0.7.6-calsim") == "0.7.6"
    assert release_part(" 0.7.6+build.5 ") == "0.7.6"
    assert parse_version(" 0.8 ") == (0, 8)
    assert in_range("0.7.6", ">=0.7.6, <0.8") and not in_range("0.8", ">=0.7.6,<0.8")


def test_a_compatibility_range_with_arabic_digits_is_a_syntax_error(factory: PackageFactory) -> None:
    root = factory.write()
    factory.edit(root, lambda raw: raw["compatibility"].__setitem__("runtime", ">=\u0660.7.6,<\u0660.8"))
    assert validate_package(root).codes == ["compat.syntax"]
    assert (root / MANIFEST_NAME).exists()


@pytest.mark.parametrize(
    "text", ["local\nhost:80", "localhost:8\n0", "[::1\n]:80", "localhost:\u0668\u0660", "host\x00:80"], ids=repr
)
def test_daemon_targets_match_whole_host_and_port(text: str) -> None:
    """client/channel.py already uses fullmatch and ASCII classes; kept here so it stays so."""
    with pytest.raises(InvalidArgument, match="target"):
        parse_target(text)
