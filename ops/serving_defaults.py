"""What a local fleet derives from the packages it serves when the operator does not say: the
scheduling policy and the job timeout (`calctl up`; docs/operations.md "calctl up: defaults from
the package").

Pure functions over parsed manifests and the time scale; nothing starts or reads a process.

- Policy. Continuous batching needs a second sequence on the board to batch or overlap with. A
  package of one KV lane holds one sequence (today's calbin: batch 1, one lane of 40,960 tokens,
  one backing vector for all slots, docs/sources.md 001 §9), whose decode steps each wait for the
  previous token: there is nothing to batch, and a prompt may be chunked only where the prefill
  declares `prefill_at_offset` (docs/sources.md 000 §5.3). So when every package served has one
  lane the default is `serial`, the path the llama.cpp integration takes today (one device job
  at a time, never chunked, docs/sources.md 001 §4); otherwise `continuous`.
- Job timeout. The daemon resets the device when one job outlasts `--job-timeout` (wall seconds,
  30 by default). Unchunked, a prompt is one job: a 30,000-token prefill is about 1,030 s on the
  modelled clock of the qwen packages (docs/performance.md), so at a time scale of 1 the default
  would reset the board in the middle of every long prompt. The derived timeout is the default
  plus twice the longest job the packages can run, at the fleet's time scale (a job submitted
  behind another waits for it, so up to two of them); at time scale 0 it is the default.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from calculet.daemon.calsim.timing import decode_ms, prefill_ms
from calculet.daemon.core.chunking import CHUNK_AUTO, chunk_tokens
from calculet.daemon.core.config import DaemonConfig
from calculet.daemon.package.manifest import PackageManifest

SERIAL, CONTINUOUS = "serial", "continuous"
QUEUED_JOBS = 2  # the job itself and one ahead of it (ping/pong: two in flight)


@dataclass(frozen=True)
class ServingDefaults:
    """What the fleet's daemons run with, each with the sentence that says why.

    Attributes:
        policy: "serial" or "continuous".
        policy_reason: why that policy.
        job_timeout_s: the daemons' `--job-timeout`, whole seconds.
        job_timeout_reason: what it covers.
    """

    policy: str
    policy_reason: str
    job_timeout_s: float
    job_timeout_reason: str


def default_policy(manifests: Sequence[PackageManifest]) -> tuple[str, str]:
    """(policy, why): `serial` when every package holds one KV lane, else `continuous`."""
    many = [m.name for m in manifests if m.kv.lanes > 1]
    if manifests and not many:
        names = ", ".join(m.name for m in manifests)
        return SERIAL, (
            f"{names}: one KV lane, so one sequence on the board and nothing to batch; serial is today's path "
            "and never chunks a prompt"
        )
    return CONTINUOUS, f"{', '.join(many)}: several KV lanes to batch"


def _chunked(m: PackageManifest, policy: str) -> bool:
    """Prompts are split into chunks: the continuous policy, on a prefill that declares it may."""
    return policy == CONTINUOUS and any(s.role == "prefill" and s.prefill_at_offset for s in m.submodels)


def longest_job_s(m: PackageManifest, policy: str) -> float:
    """Modelled seconds of the longest device job `m` can run under `policy`: a whole prefill bucket
    (or chunk) ending at the lane's context, or a decode step of the largest batch there."""
    t = m.timing
    context = m.kv.lane_context
    bucket = min(context, max(s.max_tokens for s in m.submodels if s.role == "prefill"))
    batch = max(s.batch for s in m.submodels if s.role == "decode")
    tokens = chunk_tokens(CHUNK_AUTO, t, bucket, batch) if _chunked(m, policy) else bucket
    return max(prefill_ms(t, tokens, context - tokens), decode_ms(t, batch, context)) / 1000.0


def serving_defaults(
    manifests: Sequence[PackageManifest], time_scale: float, policy: str | None = None
) -> ServingDefaults:
    """The policy (`policy`, or `default_policy`) and job timeout for a fleet serving `manifests`.

    Args:
        manifests: the packages the fleet serves (at least one, each with a prefill and a decode).
        time_scale: calsim wall seconds per modelled second.
        policy: the operator's choice; None derives it.
    """
    chosen, why = default_policy(manifests) if policy is None else (policy, "as asked")
    base = DaemonConfig.job_timeout_s
    longest = max(longest_job_s(m, chosen) for m in manifests)
    timeout = float(math.ceil(base + QUEUED_JOBS * time_scale * longest))
    return ServingDefaults(
        policy=chosen,
        policy_reason=why,
        job_timeout_s=timeout,
        job_timeout_reason=(
            f"{base:g} s + {QUEUED_JOBS} x the longest job ({longest:,.1f} modelled s) x time scale {time_scale:g}"
        ),
    )
