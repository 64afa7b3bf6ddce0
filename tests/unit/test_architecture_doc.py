"""docs/architecture.md's error table and lifecycle tables are the code's: the block between the
doc's `<!-- errors -->` markers is rendered from `ErrorKind` and its two mappings (gRPC code, HTTP
status and OpenAI type), and each table between its `<!-- lifecycles -->` markers from the
transition table itself (states and their allowed next states), so a kind or an edge added in the
code and not in the doc fails here. Regenerate the blocks with
`python -m tests.unit.test_architecture_doc` and paste them."""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from pathlib import Path

from calculet.client.cursor import STREAM_TRANSITIONS
from calculet.client.state import CLIENT_TRANSITIONS
from calculet.common.error_codes import GRPC_CODE
from calculet.common.errors import ErrorKind
from calculet.daemon.calsim.handles import CONFIG_EDGES
from calculet.daemon.calsim.job import STATUS_EDGES, STEP_EDGES
from calculet.daemon.core.client_job import SEQ_TRANSITIONS
from calculet.daemon.core.executor import LIMIT_TRANSITIONS
from calculet.daemon.core.job_buffers import BUFFER_TRANSITIONS, POOL_TRANSITIONS
from calculet.daemon.core.kv import LANE_TRANSITIONS
from calculet.daemon.core.model_state import MODEL_TRANSITIONS
from calculet.daemon.core.resets.budget import HALT_TRANSITIONS, RESET_TRANSITIONS
from calculet.daemon.grammar.matcher import MATCHER_TRANSITIONS
from calculet.daemon.sampling.thinking import THINK_TRANSITIONS
from calculet.gateway.errors import HTTP_OF_KIND
from calculet.gateway.fleet.board import BOARD_TRANSITIONS
from calculet.gateway.routing.claim import CLAIM_TRANSITIONS
from calculet.gateway.routing.sent_prefixes import ENTRY_TRANSITIONS
from calculet.ops.commands.rollout_board import STEPS

DOC = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"
BLOCKS = ("errors", "lifecycles")
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
    ("a choice's claim on a board", CLAIM_TRANSITIONS),
    ("a prompt in the router's pick-time view", ENTRY_TRANSITIONS),
    ("a rollout of one board", STEPS),
]


def render_errors() -> str:
    """The errors block: one row per kind."""
    out = ["| kind | gRPC status | HTTP status | OpenAI error type |", "| --- | --- | --- | --- |"]
    for kind in ErrorKind:
        status, kind_type = HTTP_OF_KIND[kind]
        out.append(f"| {kind.name} | {GRPC_CODE[kind].name} | {status} | `{kind_type}` |")
    return "\n".join(out)


def render_lifecycles() -> str:
    """The lifecycles block."""
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


RENDER = {"errors": render_errors, "lifecycles": render_lifecycles}


def block(text: str, name: str) -> str:
    return text.split(f"<!-- {name} -->", 1)[1].split(f"<!-- /{name} -->", 1)[0].strip()


def test_the_docs_error_and_lifecycle_tables_are_the_codes() -> None:
    text = DOC.read_text(encoding="utf-8")
    for name in BLOCKS:
        assert block(text, name) == RENDER[name]().strip(), f"docs/architecture.md's {name} are stale: regenerate them"


if __name__ == "__main__":
    for name in BLOCKS:
        print(f"<!-- {name} -->\n{RENDER[name]()}\n<!-- /{name} -->\n")
