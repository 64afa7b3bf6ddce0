"""Identifier types shared by the core modules (one place, so signatures say what they hold), and
the one function that makes the job ids clients see."""

from __future__ import annotations

import secrets
from typing import TypeAlias

SequenceId: TypeAlias = str
"""A client's job: its sequence (one prompt + its generated tokens), which owns at most one KV lane.
It is the job id a client gets from Submit (`new_sequence_id`)."""

DeviceJobId: TypeAlias = int
"""One device job built by the executor (a prefill of one sequence or a batched decode step); not the
client's job, whose id is a `SequenceId`."""

MAX_SEQUENCE_ID_CHARS = 64  # inference.proto SubmitResponse.job_id: at most 64 ASCII characters
_ID_BYTES = 18  # 144 random bits: 24 URL-safe characters


def new_sequence_id() -> SequenceId:
    """A fresh job id for Submit: random, so holding it is what proves the right to Wait on or Cancel
    the job (inference.proto). A counter or a boot prefix would let one client guess another's ids.

    Returns:
        24 URL-safe base64 characters ([A-Za-z0-9_-]) from the OS's CSPRNG.
    """
    return secrets.token_urlsafe(_ID_BYTES)
