"""The progress bar of `calctl load` on a terminal, fed by the Load stream; not a command itself.

A load goes through three phases before it is published: VALIDATING (manifest and file hashes),
CONFIGURING (the calbin onto the device; DRAINING / UNLOADING while a replaced generation leaves
first on a one-calbin board) and WARMING (the golden prefill/decode check); READY completes the bar,
FAILED stops it where it was. Each LoadProgress message is also printed above the bar as the same
line `calctl load` prints without a terminal (`progress_line`), so the history stays on screen;
byte counts between a phase's first and last only move the bar.

While a phase measures bytes (LoadProgress.bytes_total > 0: today VALIDATING, hashing the package
files; the daemon throttles these to about one per 1 %), a second row under the phase bar shows
them (rich's DownloadColumn and TransferSpeedColumn); a message without bytes hides it again.
Data flow: `daemon_load.run` -> `LoadBar.update(progress)` per message -> rich `Progress`.
"""

from __future__ import annotations

from rich import filesize
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    ProgressColumn,
    SpinnerColumn,
    Task,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TransferSpeedColumn,
)
from rich.text import Text

from calculet.ops.commands.status_view import model_state
from calculet.v1 import common_pb2, operate_pb2

M = common_pb2
# Phases finished when the alias is in each state (of PHASES in all).
PHASES_DONE = {
    M.MODEL_STATE_VALIDATING: 0,
    M.MODEL_STATE_DRAINING: 1,
    M.MODEL_STATE_UNLOADING: 1,
    M.MODEL_STATE_CONFIGURING: 1,
    M.MODEL_STATE_WARMING: 2,
    M.MODEL_STATE_READY: 3,
}
PHASES = 3


def progress_line(p: operate_pb2.LoadProgress) -> str:
    """One progress message as a line: elapsed seconds, state, generation, message, bytes [error]."""
    line = f"{p.elapsed_s:7.2f}s  {model_state(p.state):<11} generation {p.generation}  {p.message}"
    if p.bytes_total:
        line += f"  ({filesize.decimal(p.bytes_done)} / {filesize.decimal(p.bytes_total)})"
    return line + (f"  [{p.error.message}]" if p.HasField("error") else "")


def _midway(p: operate_pb2.LoadProgress) -> bool:
    """A byte count between the first (0) and the last (all) of its phase."""
    return 0 < p.bytes_done < p.bytes_total


class _AmountColumn(ProgressColumn):
    """The phase row's "n/3 phases"; the byte row's bytes done / total (rich's DownloadColumn)."""

    def __init__(self) -> None:
        super().__init__()
        self._download = DownloadColumn()

    def render(self, task: Task) -> Text:
        if task.fields.get("bytes"):
            return self._download.render(task)
        return Text(f"{int(task.completed)}/{int(task.total or 0)} phases")


class _SpeedColumn(ProgressColumn):
    """Bytes per second (rich's TransferSpeedColumn) on the byte row; nothing on the phase row."""

    def __init__(self) -> None:
        super().__init__()
        self._speed = TransferSpeedColumn()

    def render(self, task: Task) -> Text:
        return self._speed.render(task) if task.fields.get("bytes") else Text("")


class LoadBar:
    """A rich progress display for one load (use as a context manager around the stream).

    Args:
        console: the terminal console to draw on.
        alias: the alias being loaded (the bar's label).
    """

    def __init__(self, console: Console, alias: str) -> None:
        self._alias = alias
        self._progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            _AmountColumn(),
            _SpeedColumn(),
            TimeElapsedColumn(),
            console=console,
        )
        self._task: TaskID = self._progress.add_task(f"{alias}: starting", total=PHASES)
        self._bytes: TaskID = self._progress.add_task("", total=None, visible=False, bytes=True)
        self._bytes_state: int | None = None  # the state whose bytes the byte row counts

    def __enter__(self) -> LoadBar:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    def update(self, p: operate_pb2.LoadProgress) -> None:
        """Show one progress message: its line above the bars (unless it is a byte count midway
        through a phase), the phase bar at its phase, the byte row while the phase has bytes."""
        self._show_bytes(p)
        state = model_state(p.state)
        label = f"{self._alias} generation {p.generation}: {state}"
        if p.state == M.MODEL_STATE_FAILED:
            self._progress.update(self._task, description=f"[red]{label}[/red]")
        else:
            done = PHASES_DONE.get(p.state, self._progress.tasks[0].completed)
            self._progress.update(self._task, completed=done, description=label)
        if not _midway(p):
            self._progress.refresh()  # printing redraws the bars as last rendered: render them now
            self._progress.console.print(progress_line(p), highlight=False)

    def _show_bytes(self, p: operate_pb2.LoadProgress) -> None:
        """The byte row: restarted when a new phase starts counting, hidden when a message has none."""
        if not p.bytes_total:
            self._progress.update(self._bytes, visible=False)
            self._bytes_state = None
            return
        label = f"  {model_state(p.state).lower()} bytes"
        if self._bytes_state != p.state:  # a new count: its speed must not average the last one's
            self._progress.reset(
                self._bytes, total=p.bytes_total, completed=p.bytes_done, visible=True, description=label
            )
            self._bytes_state = p.state
            return
        self._progress.update(self._bytes, total=p.bytes_total, completed=p.bytes_done, visible=True)
