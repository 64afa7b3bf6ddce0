"""Jump-forward: a constraint's forced token run costs one prefill, not one decode step per token
(docs/daemon.md "Constrained decoding", "Jump-forward").

Often the grammar admits exactly one token for several steps in a row (a schema's keys and
punctuation, the wrapper around a named tool call). After a drawn token, `forced_run` asks the
sequence's matcher for that run (`GrammarMatcher.forced_after`: each token the only one its mask
allows); `settle_run` decides what it means. The run's tokens are accepted and streamed at once, as
if each had been drawn (logprob 0.0, the step path's for a one-token mask); then either the run
ends the sequence (a stop token, the grammar completed, max_tokens reached: no device job at all),
or the sequence's next job is a prefill of the drawn token and the run at the lane's offset
(`Jumped`: the sequence is PARTIAL, as between two chunks), whose last logits are sampled as usual.

Exactness: the tokens are those the step path is forced to take, and the RNG is keyed by (seed,
step) with step = tokens generated so far (`sampling/rng.py`), so every token drawn after the jump
is drawn with the step path's uniforms, and a resume or failover replays the forced tokens like
any others.

Only where declared: a package's prefill submodel must declare `prefill_at_offset` (docs/package.md);
otherwise (or when the modelled costs say a prefill never pays) `min_run` is 0 and nothing jumps.

Threshold (`min_jump_run`): a run of k forced tokens after a drawn one replaces k + 1 decode steps
with one prefill of k + 1 tokens, and the prefill holds the device's one compute unit: every other
stream waits for it. So it is priced against this stream's SHARE of the steps it replaces: with r
sequences running (lanes held), a step of the decode submodel that carries r rows costs
`t1 * (1 + alpha * (B - 1))` (B its compiled batch) shared r ways, and the prefill pays once
`fixed + per_token * (k + 1) < (k + 1) * step / r` (short context; both pay the attention reads).
On the qwen preset (t1 17.17 ms, alpha 0.1, prefill 17.17 ms + 4.79 ms a token): one stream jumps
any run (k >= 1: 26.7 ms against 34.3 ms); 4 streams in a batch-4 step (22.3 ms, 5.58 ms each)
only runs of 21 or more; at 16 streams (42.9 ms, 2.68 ms each, below a prefill token) none. The
table is built per running count when the model is configured (`jump_thresholds`). A run that ends
the sequence needs no device job, so it is taken at any length. Measured: docs/performance.md
("Jump-forward"): a per-stream rule made 4 concurrent streams 19-28 % slower.

Caps, checked before anything changes: a run never passes the step that max_tokens ends, the lane's
context, or one prefill chunk (the jump is one prefill job).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from calculet.daemon.core.client_job import ClientJob
from calculet.daemon.core.events import FinishReason, TokenLogprob
from calculet.daemon.grammar.matcher import NO_RUN, ForcedRun, MatcherState
from calculet.daemon.package.manifest import PackageManifest, TimingDecl

MAX_MIN_RUN = 4096  # a prefill that pays only past this many forced tokens: never (0)


@dataclass(frozen=True)
class Jumped:
    """The sequence's forced run is in its tokens, not in its lane: a prefill of them at the lane's
    offset follows (the sequence waits PARTIAL, like a prefill between chunks)."""


@dataclass
class JumpStats:
    """Jumps of one generation since it was configured (mutated under the engine lock).

    Attributes:
        runs: forced runs appended without decoding them.
        tokens: their tokens.
        ended: runs that ended their sequence (no prefill followed).
    """

    runs: int = 0
    tokens: int = 0
    ended: int = 0


def min_jump_run(timing: TimingDecl, running: int = 1, compiled_batch: int = 1) -> int:
    """The least forced run (>= 1) whose prefill costs less than this stream's share of the decode
    steps it replaces, with `running` streams sharing decode steps of `compiled_batch` rows (module
    docstring); 0 when a prefill never pays within `MAX_MIN_RUN`."""
    step = timing.decode_curve[0].ms_per_token * (1.0 + timing.batch_alpha * (compiled_batch - 1))
    saved_per_token = step / max(1, running) - timing.prefill_ms_per_token
    if saved_per_token <= 0:
        return 0
    tokens = math.floor(timing.prefill_fixed_ms / saved_per_token) + 1  # prefilled: the drawn one and the run
    run = max(1, tokens - 1)
    return run if run <= MAX_MIN_RUN else 0


def jump_thresholds(
    manifest: PackageManifest, prefill_name: str, decode_batch_for: Callable[[int], int], lanes: int
) -> tuple[int, ...]:
    """The model's jump thresholds by running sequences (index r - 1 for r = 1..lanes): `min_jump_run`
    with the decode submodel that carries r rows (`decode_batch_for(r)`: its compiled batch). Empty
    unless its prefill submodel declares `prefill_at_offset: true` (undeclared or false: decode step
    by step)."""
    if manifest.submodel(prefill_name).prefill_at_offset is not True:
        return ()
    return tuple(min_jump_run(manifest.timing, r, decode_batch_for(r)) for r in range(1, lanes + 1))


def forced_run(seq: ClientJob, token: int, *, context: int, chunk: int) -> ForcedRun:
    """The run the sequence's grammar forces after its drawn `token` (which does not end it), capped
    so that it ends at the latest with the token max_tokens ends on, fits the lane's `context` after
    the prefill that follows, and fits one prefill `chunk` with the drawn token. Called by the
    completion thread (no lock: the job owns the sequence's matcher until its settlement).

    Returns `NO_RUN` for a row that may not jump: unconstrained, inside or opening a think block, or
    with no room left."""
    g = seq.grammar
    if g is None or g.state is not MatcherState.ACTIVE:
        return NO_RUN
    if seq.thinking is not None and not seq.thinking.is_answer(token):
        return NO_RUN
    held = len(seq.prompt) + len(seq.generated) + 1  # with the drawn token
    limit = min(seq.remaining - 1, context - held, chunk - 1)
    return g.forced_after(token, limit) if limit > 0 else NO_RUN


def settle_run(seq: ClientJob, run: ForcedRun, min_run: int) -> tuple[tuple[int, ...], FinishReason | None] | None:
    """What a forced run after a drawn token (that continues the sequence) means: the tokens to
    append and the reason they end the sequence (None: a prefill follows), or None to decode step by
    step (a run too short to pay: shorter than `min_run`, or `min_run` 0: no jump pays now). The step
    path's end rules, token by token: the grammar completed or a stop token ends it STOP, the token
    max_tokens allows last ends it LENGTH. No change."""
    tokens = run.tokens
    for i, t in enumerate(tokens):
        if t in seq.stop_ids:
            return tokens[: i + 1], FinishReason.STOP
    if run.completes:
        return tokens, FinishReason.STOP
    if tokens and len(tokens) >= seq.remaining - 1:  # `remaining` counts the drawn token too
        return tokens, FinishReason.LENGTH
    if not tokens or min_run < 1 or len(tokens) < min_run:
        return None
    return tokens, None


def forced_logprobs(seq: ClientJob, tokens: tuple[int, ...]) -> tuple[TokenLogprob, ...]:
    """The logprobs the step path reports for tokens a one-token mask forced: 0.0 (the masked row's
    whole mass), and the token itself as the one finite alternative when alternatives are asked for
    (`sampling/logprobs.py`). Empty when the request asks for none."""
    n = seq.request.sampling.logprobs
    if n is None:
        return ()
    return tuple(TokenLogprob(t, 0.0, ((t, 0.0),) if n > 0 else ()) for t in tokens)
