"""Every job state has a wire state: a Status taken while a job sits between two prefill chunks
(PARTIAL) once answered INTERNAL (KeyError), found by the soak (issue 21)."""

from __future__ import annotations

import pytest

from calculet.daemon import wire_views
from calculet.daemon.core.client_job import SeqState
from calculet.daemon.core.observe.status import JobView
from calculet.v1 import observe_pb2


@pytest.mark.parametrize("state", list(SeqState), ids=lambda s: s.name)
def test_every_job_state_converts(state: SeqState) -> None:
    view = JobView("j", "tiny", 1, state.name, None, 3, 0, 0, 0.5, "")
    pb = wire_views._job_to_pb(view)
    assert pb.state != observe_pb2.JOB_STATE_UNSPECIFIED


def test_a_job_between_prefill_chunks_is_in_prefill() -> None:
    view = JobView("j", "tiny", 1, SeqState.PARTIAL.name, 2, 300, 0, 0, 0.5, "")
    assert wire_views._job_to_pb(view).state == observe_pb2.JOB_STATE_PREFILL
