"""`tests/rewrite_cache.py`: a test module or conftest whose cached rewrite pytest would not read (none,
or one written for other source) is stale; a tree whose rewrites pytest reads is fresh, and so is a
source touched without a change, as pytest checks the hash."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.rewrite_cache import stale_modules


def _collect(root: Path) -> None:
    """A collection with bytecode writing on: pytest writes the rewrites it would read."""
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": ""}
    cmd = [sys.executable, "-m", "pytest", "-q", "--collect-only", "-p", "no:cacheprovider", str(root)]
    subprocess.run(cmd, cwd=root, env=env, check=True, capture_output=True)


def test_only_modules_whose_rewrite_pytest_would_not_read_are_stale(tmp_path: Path) -> None:
    test_module, conftest, helper = tmp_path / "test_a.py", tmp_path / "sub" / "conftest.py", tmp_path / "helpers.py"
    conftest.parent.mkdir()
    test_module.write_text("def test_one():\n    assert 1\n")
    conftest.write_text("X = 1\n")
    helper.write_text("Y = 1\n")
    assert set(stale_modules([tmp_path])) == {test_module, conftest}, "helpers are not rewritten"

    _collect(tmp_path)
    assert stale_modules([tmp_path]) == []
    os.utime(test_module, (0, 0))  # touched, same text: pytest reads its rewrite by the source hash
    assert stale_modules([tmp_path]) == []
    test_module.write_text("def test_one():\n    assert 2\n")
    assert stale_modules([tmp_path]) == [test_module]
