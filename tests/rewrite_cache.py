"""Is pytest's cache of rewritten test modules fresh? Exit 0 if so, 1 if a collection must write it.

These machines set PYTHONDONTWRITEBYTECODE, and pytest then rewrites the asserts of every test module
in every worker. So the Makefile's REWRITTEN step runs one collection with bytecode writing on, and the
workers read the cache it writes. On a tree whose cache is already fresh that collection is about 3 s
of wall before any test starts. This check skips it: each test module and conftest has a cached
rewrite beside it (`__pycache__/<name>.<python tag>-pytest-<version>.pyc`) whose header pytest would
accept, as its `_read_pyc` checks it: this Python's magic number, the checked-hash flag, and the hash
of the source as it is now.

    python -m tests.rewrite_cache tests/unit tests/integration
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterable
from importlib.metadata import version
from pathlib import Path

CHECKED_HASH = b"\x03\x00\x00\x00"  # the pyc flags pytest writes: hash-based, checked


def stale_modules(roots: Iterable[Path]) -> list[Path]:
    """The test modules and conftests under `roots` whose cached rewrite pytest would not read."""
    tag = f"{sys.implementation.cache_tag}-pytest-{version('pytest')}"
    return [
        source
        for root in roots
        for source in sorted([*root.rglob("test_*.py"), *root.rglob("conftest.py")])
        if not _fresh(source, source.parent / "__pycache__" / f"{source.stem}.{tag}.pyc")
    ]


def _fresh(source: Path, cached: Path) -> bool:
    try:
        header = cached.read_bytes()[:16]
    except OSError:
        return False
    expected = importlib.util.MAGIC_NUMBER + CHECKED_HASH + importlib.util.source_hash(source.read_bytes())[:8]
    return header == expected


if __name__ == "__main__":
    sys.exit(1 if stale_modules(Path(arg) for arg in sys.argv[1:]) else 0)
