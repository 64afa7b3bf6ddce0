"""Prefill at an offset: whether a generation may run a prefill after `past_kv_len > 0`, and so
whether it chunks long prompts, reuses parked prefixes and jumps forward (docs/daemon.md,
"Conversations: prefix reuse and chunked prefill", "Prefill at an offset"; docs/sources.md 000 §5.3).

Chunked prefill, prefix reuse and jump-forward all run prefills at a non-zero offset: the new tokens
attend over KV that an earlier job wrote. docs/sources.md 000 §5.3 allows that only where the
calbin supports the incremental semantics (splitting a prompt and assuming the KV is the same is not
allowed), and nothing on the board says whether it does. So a package says so (`prefill_at_offset`
on its prefill submodel, docs/package.md), and the load proves it (`offset_probe.py`) before a
client's prompt depends on it.

`decide` turns what the package declares and what the probe saw into an `OffsetDecision`:

| declared | probe | chunking, reuse, jump-forward | verdict |
| --- | --- | --- | --- |
| true | three runs identical | as the settings ask | PROVEN |
| true | runs differ (or could not run) | off | REFUTED |
| absent or false | not run | off | UNDECLARED |

Off means each prompt is one prefill at offset 0 (prompts up to the prefill bucket), and no lane is
parked or matched. An operator who forced chunking or prefix reuse on (`--prefill-chunk-tokens on`
or a number, `--prefix-reuse on`) is refused instead of served differently: `PrefillOffsetRefused`
fails the load. Pure: the model manager calls it on its load thread.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from calculet.common.errors import FailedPrecondition
from calculet.daemon.package.manifest import PackageManifest, SubmodelDecl


class OffsetVerdict(Enum):
    """Whether a generation's prefill may run at a non-zero `past_kv_len` (module docstring)."""

    PROVEN = "proven"  # declared, and the load's probe ran whole, chunked and continued identically
    REFUTED = "refuted"  # declared, but the probe's runs differed (or it could not prove it)
    UNDECLARED = "undeclared"  # the package's prefill submodel does not declare it (absent or false)


class PrefillOffsetRefused(FailedPrecondition):
    """An operator forced chunked prefill or prefix reuse on, and the package's prefill is not
    proven to run at an offset: the load fails rather than serving with them off."""


@dataclass(frozen=True)
class OffsetWants:
    """What the daemon's settings ask of the features that prefill at an offset.

    Attributes:
        chunk / reuse: chunked prefill / prefix reuse wanted (on, or auto: where the package allows).
        chunk_forced / reuse_forced: the operator asked for it explicitly (`on`, or a chunk size):
            a package that cannot have it fails to load.
    """

    chunk: bool = True
    reuse: bool = True
    chunk_forced: bool = False
    reuse_forced: bool = False


@dataclass(frozen=True)
class OffsetDecision:
    """How one generation serves prefills (module docstring).

    Attributes:
        verdict: what the package declared and the probe proved.
        reason: why, in words (Status, the log).
        chunked / prefix_reuse / jump: the features on for this generation.
    """

    verdict: OffsetVerdict
    reason: str
    chunked: bool
    prefix_reuse: bool
    jump: bool

    @property
    def allowed(self) -> bool:
        """The generation may prefill at an offset."""
        return self.verdict is OffsetVerdict.PROVEN

    def summary(self) -> str:
        """`prefill at an offset proven: chunked prefill on, prefix reuse on` style, with the reason
        when it is not proven (the load's message and the log)."""
        on = ", ".join(f"{name} {'on' if flag else 'off'}" for name, flag in self._features())
        return f"prefill at an offset {self.verdict.value}: {on}" + ("" if self.allowed else f" ({self.reason})")

    def _features(self) -> tuple[tuple[str, bool], ...]:
        return (("chunked prefill", self.chunked), ("prefix reuse", self.prefix_reuse), ("jump-forward", self.jump))


def served_prefill(manifest: PackageManifest) -> SubmodelDecl | None:
    """The prefill submodel the daemon runs (the largest bucket, as `ModelRuntime.attach` picks it)."""
    prefills = manifest.submodels_for("prefill")
    return max(prefills, key=lambda s: s.max_tokens) if prefills else None


def undeclared_reason(manifest: PackageManifest) -> str | None:
    """Why the package's prefill may not run at an offset without a probe: its prefill submodel
    does not declare `prefill_at_offset: true` (absent, or false); None when it declares it."""
    sub = served_prefill(manifest)
    if sub is None:
        return "the package has no prefill submodel"
    if sub.prefill_at_offset is True:
        return None
    if sub.prefill_at_offset is False:
        return f"prefill submodel {sub.name} declares prefill_at_offset: false"
    return f"prefill submodel {sub.name} does not declare prefill_at_offset"


def decide(verdict: OffsetVerdict, reason: str, wants: OffsetWants) -> OffsetDecision:
    """The features a generation serves with (module docstring).

    Args:
        verdict: UNDECLARED, or the probe's PROVEN / REFUTED.
        reason: why (for a verdict other than PROVEN: what is missing or what differed).
        wants: what the daemon's settings ask.

    Raises:
        PrefillOffsetRefused: not PROVEN, and the settings force chunked prefill or prefix reuse on.
    """
    if verdict is OffsetVerdict.PROVEN:
        return OffsetDecision(verdict, reason, wants.chunk, wants.reuse, True)
    forced = [name for name, f in (("chunked prefill", wants.chunk_forced), ("prefix reuse", wants.reuse_forced)) if f]
    if forced:
        raise PrefillOffsetRefused(
            f"{' and '.join(forced)} forced on, but the package's prefill is not proven to run at an offset "
            f"({verdict.value}: {reason}); set them to auto to serve it without"
        )
    return OffsetDecision(verdict, reason, False, False, False)
