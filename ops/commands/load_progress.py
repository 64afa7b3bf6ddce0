"""The progress bar of `calctl load` on a terminal, fed by the Load stream; not a command itself.

A load goes through three phases before it is published: VALIDATING (manifest and file hashes),
CONFIGURING (the calbin onto the device; DRAINING / UNLOADING while a replaced generation leaves
first on a one-calbin board) and WARMING (the golden prefill/decode check); READY completes the bar,
FAILED stops it where it was. Each LoadProgress message is also printed above the bar as the same
line `calctl load` prints without a terminal (`progress_line`), so the history stays on screen.

The Load stream carries no byte counts today (LoadProgress: state, generation, message, elapsed
seconds); the bar counts phases, and the daemon's message (e.g. which file it hashes) is its text.
Data flow: `daemon_load.run` -> `LoadBar.update(progress)` per message -> rich `Progress`.
"""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn

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
    """One progress message as a line: elapsed seconds, state, generation, message [error]."""
    line = f"{p.elapsed_s:7.2f}s  {model_state(p.state):<11} generation {p.generation}  {p.message}"
    return line + (f"  [{p.error.message}]" if p.HasField("error") else "")


class LoadBar:
    """A rich progress bar for one load (use as a context manager around the stream).

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
            TextColumn("{task.completed}/{task.total} phases"),
            TimeElapsedColumn(),
            console=console,
        )
        self._task: TaskID = self._progress.add_task(f"{alias}: starting", total=PHASES)

    def __enter__(self) -> LoadBar:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    def update(self, p: operate_pb2.LoadProgress) -> None:
        """Show one progress message: the line above the bar, the bar at its phase."""
        self._progress.console.print(progress_line(p), highlight=False)
        state = model_state(p.state)
        label = f"{self._alias} generation {p.generation}: {state}"
        if p.state == M.MODEL_STATE_FAILED:
            self._progress.update(self._task, description=f"[red]{label}[/red]")
            return
        done = PHASES_DONE.get(p.state, self._progress.tasks[0].completed)
        self._progress.update(self._task, completed=done, description=label)
