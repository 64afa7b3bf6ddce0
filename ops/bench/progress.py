"""The `--progress` bar: requests finished out of the measured total, with the failures so far, drawn
by rich on stderr (so `--json` on stdout stays clean). Disabled, it is a no-op callback."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from calculet.ops.bench.records import RequestRecord

OnDone = Callable[[RequestRecord], None]


@contextlib.contextmanager
def progress_bar(total: int, *, enabled: bool) -> Iterator[OnDone]:
    """Yields the callback to call with each finished record."""
    if not enabled:
        yield lambda record: None
        return
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True)) as bar:
        task = bar.add_task("requests", total=total)
        failed = 0

        def done(record: RequestRecord) -> None:
            nonlocal failed
            failed += 0 if record.ok else 1
            bar.update(task, advance=1, description=f"requests ({failed} failed)" if failed else "requests")

        yield done
