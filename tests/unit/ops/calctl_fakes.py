"""The fake daemon of the client tests (`tests/unit/client/fake_daemon.py`) served for the calctl
tests, and running calctl in-process with its output captured."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from calculet.ops.calctl import main
from tests.unit.client.conftest import start_server
from tests.unit.client.fake_daemon import FakeDaemon


@contextlib.contextmanager
def served(fake: FakeDaemon, sock: Path) -> Iterator[str]:
    """`fake` served on the Unix socket `sock`; yields its target."""
    server = start_server(fake, sock)
    try:
        yield f"unix://{sock}"
    finally:
        fake.open_all_gates()
        server.stop(grace=None).wait(5)


def calctl(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `calctl argv`, which must not be a usage error."""
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def usage_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """stderr of `calctl argv`, which must exit 2 (argparse)."""
    with pytest.raises(SystemExit) as info:
        main(list(argv))
    assert info.value.code == 2
    return capsys.readouterr().err
