"""Shared pytest configuration.

Every pytest process (each xdist worker too) gets a private runtime directory: `$XDG_RUNTIME_DIR`
points at a fresh temp dir, so the default board locks (`$XDG_RUNTIME_DIR/calculet/`) and calsim's
device locks (`.../calculet/calsim/`) of the daemons and devices the tests open never meet another
worker's, a real daemon's or `/run/calculet`. `$RUNTIME_DIRECTORY` and `$CALSIM_STATE_DIR` of the
caller are dropped for the same reason (`calculet.daemon.runtime_paths`). `$OPENBLAS_NUM_THREADS`
defaults to 1, as the daemon and calctl set it for themselves.

This process itself opens calsim boards (unit tests) under that directory, and may keep one held, so
a test that starts a daemon process gives it an `XDG_RUNTIME_DIR` of its own, as `DaemonProcess`
(tests/integration/conftest.py) and `LocalFleet` (`$CALSIM_STATE_DIR`, `--runtime-dir`) do.

Under pytest-xdist each worker reorders the collected tests so that the long ones start first on
every worker (tests/xdist_order.py); a run without workers keeps file order.

The collector pauses while a process collects, as the daemon's and the gateway's imports do, and after
collection each process freezes what it holds (`gc.freeze`), as they do after start-up: the full
collections that follow walk only what the tests made.

Hypothesis runs without its per-example deadline (200 ms by default): no test asserts a wall-clock
time, and a busy CI machine can stall any example that long.
"""

from __future__ import annotations

import gc
import os
import shutil
import tempfile

import pytest
from hypothesis import settings

from calculet.common import process_start
from tests.xdist_order import read_durations, reorder, xdist_workers

settings.register_profile("calculet", deadline=None)
settings.load_profile("calculet")

DROPPED_ENV = ("RUNTIME_DIRECTORY", "CALSIM_STATE_DIR")
_private_dirs: list[str] = []


def pytest_configure(config: pytest.Config) -> None:
    path = tempfile.mkdtemp(prefix="calculet-tests-")
    _private_dirs.append(path)
    os.environ["XDG_RUNTIME_DIR"] = path
    for name in DROPPED_ENV:
        os.environ.pop(name, None)
    # As calculet-daemon and calctl run: the workers, which run cores in-process, and every process a
    # test starts load numpy's OpenBLAS on one thread.
    process_start.one_blas_thread()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    workers = xdist_workers()
    if workers > 1:
        reorder(items, workers, read_durations())


def pytest_sessionstart(session: pytest.Session) -> None:
    # A process that collects (not an xdist controller) builds tens of thousands of objects that live
    # for the whole run; the collector's passes over them while they are built free nothing.
    if not session.config.pluginmanager.has_plugin("dsession"):
        gc.disable()


def pytest_collection_finish(session: pytest.Session) -> None:
    # The collected modules, fixtures' definitions and Hypothesis strategies live for the whole run:
    # out of the collector's way, so each full collection in a worker walks only what tests made.
    gc.collect()
    gc.freeze()
    gc.enable()


def pytest_unconfigure(config: pytest.Config) -> None:
    while _private_dirs:
        shutil.rmtree(_private_dirs.pop(), ignore_errors=True)
