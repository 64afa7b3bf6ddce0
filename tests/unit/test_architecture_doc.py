"""docs/architecture.md's lifecycle tables are the code's: each table between the doc's
`<!-- lifecycles -->` markers is rendered from the transition table itself (states, their allowed
next states, the initial state first), so an edge added in the code and not in the doc fails here.
Regenerate the block with `python -m tests.unit.test_architecture_doc` and paste it."""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from pathlib import Path

from calculet.client.cursor import STREAM_TRANSITIONS
from calculet.client.state import CLIENT_TRANSITIONS
from calculet.daemon.calsim.handles import CONFIG_EDGES
from calculet.daemon.calsim.job import STATUS_EDGES, STEP_EDGES
from calculet.daemon.core.executor import LIMIT_TRANSITIONS
from calculet.daemon.core.jobs import BUFFER_TRANSITIONS, POOL_TRANSITIONS
from calculet.daemon.core.kv import LANE_TRANSITIONS
from calculet.daemon.core.model_state import MODEL_TRANSITIONS
from calculet.daemon.core.reset_budget import HALT_TRANSITIONS, RESET_TRANSITIONS
from calculet.daemon.core.sequence import SEQ_TRANSITIONS
from calculet.daemon.grammar.matcher import MATCHER_TRANSITIONS
from calculet.daemon.sampling.thinking import THINK_TRANSITIONS
from calculet.gateway.fleet.board import BOARD_TRANSITIONS
from calculet.gateway.fleet.placement import PLACEMENT_TRANSITIONS
from calculet.ops.commands.rollout_board import STEPS

DOC = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"
BEGIN, END = "<!-- lifecycles -->", "<!-- /lifecycles -->"
# (what it is the life of, the table), in the doc's order: daemon, calsim, client, gateway, ops.
TABLES: list[tuple[str, Mapping[Enum, frozenset[Enum]]]] = [
    ("a model generation", MODEL_TRANSITIONS),
    ("a client job in the engine", SEQ_TRANSITIONS),
    ("a KV lane", LANE_TRANSITIONS),
    ("a job buffer (DMA)", BUFFER_TRANSITIONS),
    ("a buffer pool", POOL_TRANSITIONS),
    ("the in-flight limit", LIMIT_TRANSITIONS),
    ("the reset controller", RESET_TRANSITIONS),
    ("a board halt", HALT_TRANSITIONS),
    ("a grammar matcher", MATCHER_TRANSITIONS),
    ("a think block", THINK_TRANSITIONS),
    ("a calsim job's status", STATUS_EDGES),
    ("a calsim job's step", STEP_EDGES),
    ("a calsim configuration", CONFIG_EDGES),
    ("a daemon client", CLIENT_TRANSITIONS),
    ("a Wait stream cursor", STREAM_TRANSITIONS),
    ("a board, seen by the gateway", BOARD_TRANSITIONS),
    ("a choice's claim on a board", PLACEMENT_TRANSITIONS),
    ("a rollout of one board", STEPS),
]


def render() -> str:
    """The block between the markers."""
    out = []
    for what, edges in TABLES:
        states = list(type(next(iter(edges))))
        kind = states[0].__class__
        out.append(f"**{what}**: `{kind.__name__}` (`{kind.__module__}`)\n")
        out.append("| state | may move to |\n| --- | --- |")
        for state in states:
            targets = edges.get(state, frozenset())
            shown = ", ".join(t.name for t in states if t in targets) or "(terminal)"
            out.append(f"| {state.name} | {shown} |")
        out.append("")
    return "\n".join(out)


def test_the_docs_lifecycle_tables_are_the_codes() -> None:
    text = DOC.read_text(encoding="utf-8")
    block = text.split(BEGIN, 1)[1].split(END, 1)[0].strip()
    assert block == render().strip(), "docs/architecture.md is stale: python -m tests.unit.test_architecture_doc"


if __name__ == "__main__":
    print(render())
