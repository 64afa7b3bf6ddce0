"""`serving_defaults` and `calctl up`'s use of it, without processes: one-lane packages serve with the
serial policy, others with the continuous one; the job timeout covers the longest job the packages
can run at the fleet's time scale; the operator's `--policy` and `--job-timeout` win."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from calculet.daemon.calsim.timing import prefill_ms
from calculet.daemon.package.manifest import PackageManifest
from calculet.ops.calctl import build_parser
from calculet.ops.commands.up import fleet_config
from calculet.ops.fleet import LocalFleet
from calculet.ops.serving_defaults import serving_defaults
from calculet.ops.sim_packages.submodels import decode_submodel, prefill_submodel
from calculet.ops.sim_packages.timing import sim_timing
from tests.unit.package.conftest import valid_manifest

CONTEXT = 40_960
VOCAB = 64


def package(lanes: int, batch: int, at_offset: bool | None) -> PackageManifest:
    """A package of `lanes` lanes of 40,960 tokens with the qwen timing, a whole-context prefill
    bucket and one decode of `batch` rows."""
    m = valid_manifest()
    subs = (prefill_submodel(CONTEXT, CONTEXT, VOCAB, at_offset), decode_submodel(batch, CONTEXT, VOCAB))
    kv = dataclasses.replace(m.kv, lanes=lanes, lane_context=CONTEXT)
    return dataclasses.replace(m, name=f"l{lanes}", kv=kv, submodels=subs, timing=sim_timing())


B1 = package(1, 1, None)  # today's calbin's shape
BATCHED = package(16, 16, True)  # the qwen3-30b-a3b preset's


def test_one_lane_serves_serially_and_waits_for_a_whole_context_prefill() -> None:
    whole = prefill_ms(sim_timing(), CONTEXT, 0) / 1000.0  # about 1,823 modelled s
    d = serving_defaults([B1], 1.0)
    assert d.policy == "serial" and "one KV lane" in d.policy_reason
    assert d.job_timeout_s == math.ceil(30 + 2 * whole) > 3_600
    assert serving_defaults([B1], 0.05).job_timeout_s == math.ceil(30 + 0.1 * whole)
    assert serving_defaults([B1], 0.0).job_timeout_s == 30  # nothing sleeps: the daemon's default


def test_several_lanes_batch_and_chunk_so_the_timeout_stays_near_its_default() -> None:
    d = serving_defaults([BATCHED], 1.0)
    assert d.policy == "continuous" and "l16" in d.policy_reason
    assert 30 < d.job_timeout_s < 60  # the longest job is one chunk (64 tokens at the context's end)
    # A fleet of both batches, so it is continuous; the one-lane package's prompts are unchunked.
    both = serving_defaults([BATCHED, B1], 1.0)
    assert both.policy == "continuous" and both.job_timeout_s == serving_defaults([B1], 1.0).job_timeout_s
    # Serial never chunks: asked for on the batched package, its whole bucket is one job.
    assert serving_defaults([BATCHED], 1.0, "serial").job_timeout_s > 3_600


def test_calctl_up_applies_them_unless_the_operator_says_otherwise(tmp_path: Path) -> None:
    base = ("up", "--boards", "1", "--preset", "qwen3-30b-a3b-b1", "--dir", str(tmp_path), "--time-scale", "0.1")
    args = build_parser().parse_args(list(base))
    assert args.policy == "auto"
    derived = serving_defaults([B1], args.time_scale)
    argv = LocalFleet(fleet_config(args, derived)).daemon_argv(0)
    assert argv[argv.index("--policy") + 1] == "serial"
    assert argv[argv.index("--job-timeout") + 1] == f"{derived.job_timeout_s:g}"
    mine = build_parser().parse_args([*base, "--policy", "continuous", "--daemon-arg=--job-timeout=45"])
    argv = LocalFleet(fleet_config(mine, serving_defaults([B1], 0.1, "continuous"))).daemon_argv(0)
    assert argv[argv.index("--policy") + 1] == "continuous"
    assert "--job-timeout" not in argv and argv[-1] == "--job-timeout=45"
