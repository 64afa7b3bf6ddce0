"""A model switch as an operator makes it: one board of a `--models A,B` soak fleet goes from the
model it serves to another catalog model, as `calctl load B B --switch-from A@GEN --force` does
(a compare-and-swap `Load`, docs/models.md "Switching a board"): the board drains A (what still
runs after the drain window ends UNAVAILABLE with its resume tokens and the gateway resumes it on
the other board), unloads and verifies it, configures B and warms it up.

`switch_board(target, alias, package, reason)` is blocking (the caller runs it in a worker
thread) and never raises: a refused or failed switch is returned as the text of what happened.
`serving_alias(target)` is the alias a board serves now, for waiting until placement by demand
switched it back.
"""

from __future__ import annotations

import getpass
import socket

from calculet.client import CalculetError, DaemonClient
from calculet.client.messages import Switch, load_outcome
from calculet.ops.soak.board_probe import PROBE_TIMEOUT_S
from calculet.v1 import common_pb2

SWITCH_TIMEOUT_S = 240.0  # drain, unload, configure and warm-up of a calsim package, with room


def serving_alias(target: str, timeout_s: float = PROBE_TIMEOUT_S) -> tuple[str, int] | None:
    """`(alias, generation)` of the board's READY model, or None (none, or no answer)."""
    try:
        with DaemonClient(target, timeout=timeout_s) as client:
            status = client.status()
    except CalculetError:
        return None
    ready = [m for m in status.models if m.state == common_pb2.MODEL_STATE_READY]
    return (ready[0].alias, int(ready[0].generation)) if ready else None


def switch_board(target: str, alias: str, package: str, reason: str) -> str:
    """Switch the board at `target` to `alias` from `package` (module docstring); returns what
    happened: `switched from A@g to B@h`, or why not."""
    current = serving_alias(target)
    if current is None:
        return "refused: the board serves no READY model"
    if current[0] == alias:
        return f"nothing to do: the board already serves {alias}@{current[1]}"
    switch = Switch(current[0], current[1], force=True, reason=reason, requester=_requester())
    last = None
    try:
        with DaemonClient(target, timeout=SWITCH_TIMEOUT_S) as client:
            for progress in client.load(alias, package, switch=switch):
                last = progress
        done = load_outcome(last, alias)
    except CalculetError as err:
        return f"failed: {err.kind.value}: {err}"
    return f"switched from {current[0]}@{current[1]} to {alias}@{done.generation}"


def _requester() -> str:
    """Who asks, for the board's audit trail (as `calctl load` says it)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"calctl soak ({user}@{socket.gethostname()})"
