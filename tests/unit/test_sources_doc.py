"""docs/sources.md covers every source-document section the repository cites, and nothing cites
the documents where a reader of this repository cannot follow.

A citation is `NNN §X` (000, 001 or 003), with continuations (`003 §6-8, §13`, `000 §9 and §17`)
and qualifiers (`§10.3 step 5`, `§9 P0.4`, `§8 C1`, `§16 M4`). Each cited section X must have its
heading `### NNN §X: ...` in docs/sources.md, and a cited subsection X.Y (`000 §10.3`) must be
named in that heading's text. A file that cites a section names docs/sources.md. No file cites the
documents as "seed 001 section 10", "the seeds" or by their path outside the repository, and every
heading of docs/sources.md is cited somewhere (a section nothing uses does not belong there)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ROOT / "docs" / "sources.md"
SCANNED_DIRS = ("daemon", "client", "gateway", "ops", "common", "protos", "tests", "docs")
SCANNED_FILES = ("README.md",)
TEXT_SUFFIXES = frozenset({".py", ".proto", ".md", ".txt", ".toml", ".yaml", ".yml", ".json"})
THIS_FILE = Path(__file__).resolve()

HEADING = re.compile(r"^### (00[013]) §(\d+): \S", re.MULTILINE)
START = re.compile(r"\b(00[013]) (?=§)")
SECTION = re.compile(r"§(\d+(?:\.\d+)?)(?:-(\d+(?:\.\d+)?))?")
QUALIFIER = re.compile(r" (?:step \d+|P\d(?:\.\d+)?(?:-P?\d(?:\.\d+)?)?|C\d|M\d)")
CONTINUATION = re.compile(r"(?:, | and | or )(?=§)")
# The old ways of citing the documents: by "seed" and number, as "the seeds", or by their path.
STALE = re.compile(
    r"\bseed 00\d|\bseed's|\bseeds'|\bthe seeds\b|\bseed \d+\.\d|\.\./shared|shared/seeds|DESIGN\.md", re.IGNORECASE
)


def _expand(first: str, last: str | None) -> list[str]:
    """`6-8` -> 6, 7, 8; `5.1-5.2` -> 5.1, 5.2; `4` -> 4."""
    if last is None:
        return [first]
    if "." not in first and "." not in last:
        return [str(n) for n in range(int(first), int(last) + 1)]
    major, minor_first = first.split(".") if "." in first else (first, "0")
    last_major, minor_last = last.split(".") if "." in last else (last, "0")
    if major == last_major:
        return [f"{major}.{n}" for n in range(int(minor_first), int(minor_last) + 1)]
    return [first, last]


def citations(text: str) -> Iterator[tuple[str, str]]:
    """Every (document, section) the text cites, ranges and continuations expanded."""
    for start in START.finditer(text):
        doc, pos = start.group(1), start.end()
        while (section := SECTION.match(text, pos)) is not None:
            yield from ((doc, s) for s in _expand(section.group(1), section.group(2)))
            pos = section.end()
            if (qualifier := QUALIFIER.match(text, pos)) is not None:
                pos = qualifier.end()
            if (continuation := CONTINUATION.match(text, pos)) is None:
                break
            pos = continuation.end()


def sections(doc_text: str) -> dict[tuple[str, str], str]:
    """docs/sources.md's headings, (document, section) -> the text up to the next heading."""
    found = list(HEADING.finditer(doc_text))
    ends = [m.start() for m in found[1:]] + [len(doc_text)]
    return {(m.group(1), m.group(2)): doc_text[m.start() : end] for m, end in zip(found, ends, strict=True)}


def scanned_files() -> Iterator[Path]:
    for name in SCANNED_DIRS:
        for path in sorted((ROOT / name).rglob("*")):
            if path.is_file() and path.suffix in TEXT_SUFFIXES and ".venv" not in path.parts:
                yield path
    for name in SCANNED_FILES:
        yield ROOT / name


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


def test_the_citation_parser_reads_ranges_continuations_and_qualifiers() -> None:
    text = "(docs/sources.md 003 §6-8, §13; 000 §10.3 step 5 and §17, 001 §9 P0.4, §4.1-4.2; 001 §8 C1)"
    assert list(citations(text)) == [
        ("003", "6"), ("003", "7"), ("003", "8"), ("003", "13"), ("000", "10.3"), ("000", "17"),
        ("001", "9"), ("001", "4.1"), ("001", "4.2"), ("001", "8"),
    ]  # fmt: skip
    assert list(citations("seed 2001 §3 and 1000 §4")) == []


def test_the_headings_are_grouped_by_document_in_section_order() -> None:
    keys = list(sections(_read(SOURCES)))
    assert keys, "docs/sources.md has no `### NNN §X: ...` headings"
    assert keys == sorted(keys, key=lambda k: (k[0], int(k[1]))), keys
    assert len(set(keys)) == len(keys), "a section has two headings"


def test_every_cited_section_has_its_heading_and_every_subsection_is_named_there() -> None:
    body = sections(_read(SOURCES))
    missing: list[str] = []
    for path in scanned_files():
        for doc, section in citations(_read(path)):
            top = section.split(".")[0]
            where = f"{path.relative_to(ROOT)}: {doc} §{section}"
            if (doc, top) not in body:
                missing.append(f"{where} (no heading `### {doc} §{top}: ...`)")
            elif "." in section and f"§{section}" not in body[(doc, top)]:
                missing.append(f"{where} (not named under `### {doc} §{top}`)")
    assert missing == []


def test_a_file_that_cites_a_section_names_docs_sources_md() -> None:
    unnamed = [
        str(path.relative_to(ROOT))
        for path in scanned_files()
        if path != SOURCES and any(citations(text := _read(path))) and "docs/sources.md" not in text
    ]
    assert unnamed == []


def test_nothing_cites_the_documents_outside_the_repository() -> None:
    stale = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in scanned_files()
        if path.resolve() != THIS_FILE
        for n, line in enumerate(_read(path).splitlines(), 1)
        if STALE.search(line)
    ]
    assert stale == []


def test_every_heading_is_cited_somewhere() -> None:
    cited = {
        (doc, section.split(".")[0])
        for path in scanned_files()
        if path != SOURCES
        for doc, section in citations(_read(path))
    }
    assert sorted(set(sections(_read(SOURCES))) - cited) == []
