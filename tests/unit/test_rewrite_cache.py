"""`tests/rewrite_cache.py`: a test module or conftest without a cached rewrite at least as new as its
source is stale, and a tree with every rewrite in place is fresh."""

from __future__ import annotations

import os
import sys
from importlib.metadata import version
from pathlib import Path

from tests.rewrite_cache import stale_modules


def _cache(source: Path) -> Path:
    cached = (
        source.parent / "__pycache__" / f"{source.stem}.{sys.implementation.cache_tag}-pytest-{version('pytest')}.pyc"
    )
    cached.parent.mkdir(exist_ok=True)
    cached.write_bytes(b"")
    return cached


def test_a_module_without_its_rewrite_or_older_than_its_source_is_stale(tmp_path: Path) -> None:
    test_module, conftest, helper = tmp_path / "test_a.py", tmp_path / "sub" / "conftest.py", tmp_path / "helpers.py"
    conftest.parent.mkdir()
    for source in (test_module, conftest, helper):
        source.write_text("x = 1\n")
    assert set(stale_modules([tmp_path])) == {test_module, conftest}, "helpers are not rewritten"

    old = _cache(test_module)
    _cache(conftest)
    assert stale_modules([tmp_path]) == []
    os.utime(old, (0, 0))  # the source changed after its rewrite
    assert stale_modules([tmp_path]) == [test_module]
