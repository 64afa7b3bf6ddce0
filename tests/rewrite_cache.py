"""Is pytest's cache of rewritten test modules fresh? Exit 0 if so, 1 if a collection must write it.

These machines set PYTHONDONTWRITEBYTECODE, and pytest then rewrites the asserts of every test module
in every worker. So the Makefile's REWRITTEN step runs one collection with bytecode writing on, and the
workers read the cache it writes. On a tree whose cache is already fresh that collection is about 3 s
of wall before any test starts. This check skips it: it stats each test module and conftest and the
cached rewrite beside it (`__pycache__/<name>.<python tag>-pytest-<version>.pyc`, written after the
source).

    python -m tests.rewrite_cache tests/unit tests/integration
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from importlib.metadata import version
from pathlib import Path


def stale_modules(roots: Iterable[Path]) -> list[Path]:
    """The test modules and conftests under `roots` with no cached rewrite at least as new as they are."""
    tag = f"{sys.implementation.cache_tag}-pytest-{version('pytest')}"
    stale = []
    for root in roots:
        for source in sorted([*root.rglob("test_*.py"), *root.rglob("conftest.py")]):
            cached = source.parent / "__pycache__" / f"{source.stem}.{tag}.pyc"
            if not cached.exists() or cached.stat().st_mtime < source.stat().st_mtime:
                stale.append(source)
    return stale


if __name__ == "__main__":
    sys.exit(1 if stale_modules(Path(arg) for arg in sys.argv[1:]) else 0)
