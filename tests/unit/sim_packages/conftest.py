"""Built packages shared by the sim_packages tests (each preset is built once per session)."""

from __future__ import annotations

from pathlib import Path

import pytest

from calculet.ops.sim_packages import build_sim_package


@pytest.fixture(scope="session")
def qwen_pkg(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A default `qwen3-30b-a3b` package; tests must not modify it."""
    return build_sim_package("qwen3-30b-a3b", tmp_path_factory.mktemp("qwen") / "pkg")


@pytest.fixture(scope="session")
def dense_pkg(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A default `qwen3-4b` package (dense, one chip); tests must not modify it."""
    return build_sim_package("qwen3-4b", tmp_path_factory.mktemp("qwen4b") / "pkg")


@pytest.fixture(scope="session")
def b1_pkg(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A default `qwen3-30b-a3b-b1` package (today's batch-1 calbin); tests must not modify it."""
    return build_sim_package("qwen3-30b-a3b-b1", tmp_path_factory.mktemp("b1") / "pkg")


@pytest.fixture(scope="session")
def tiny_pkg(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A default `tiny` package; tests must not modify it."""
    return build_sim_package("tiny", tmp_path_factory.mktemp("tiny") / "pkg")


@pytest.fixture(params=["tiny", "qwen3-30b-a3b", "qwen3-4b"])
def any_pkg(request: pytest.FixtureRequest) -> Path:
    """Each preset's package in turn."""
    name = {"tiny": "tiny_pkg", "qwen3-30b-a3b": "qwen_pkg", "qwen3-4b": "dense_pkg"}[request.param]
    path: Path = request.getfixturevalue(name)
    return path
