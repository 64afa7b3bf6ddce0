"""The gateway's view of one daemon: an ABC over what it calls, and its `calculet.client` adapter.

The gateway needs six things from a board daemon: start a generation (Submit + Wait), describe
a model (GetModel), stream load reports (WatchLoad), stream health (grpc.health.v1 Watch), switch
its model (Load with a compare-and-swap `switch_from`, for placement by demand), and close.
`DaemonConnection` states exactly that, so unit tests drive the fleet, router and failover logic
with fakes implementing the same ABC, and `ClientConnection` adapts `calculet.client.
AsyncDaemonClient` (which owns the gRPC channel) for real daemons.

Failover needs broken streams to surface at once: the adapter's client re-attaches a broken Wait
stream zero times (`max_reattach=0`) and the gateway resubmits elsewhere with resume_tokens.

Access planes: the adapter sends the gateway's inference-plane token (if any) on every call, and
dials with TLS when given one. A daemon that refuses those credentials (UNAUTHENTICATED,
PERMISSION_DENIED) on Submit or GetModel is a misconfigured board, not the HTTP client's fault: the
adapter reports it as UNAVAILABLE, so the request tries another board and, failing all, gets a
503 rather than a 401/403 that would blame the caller's API key. A switch is an operate-plane call:
it sends the operate token (`--daemon-operate-token-file`) on a channel of its own.
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

from calculet.client import AsyncDaemonClient, AsyncGeneration, SamplingParams, TlsConfig
from calculet.client.convert import model_state_from_pb
from calculet.client.messages import Switch, load_outcome
from calculet.client.types import FinalEvent, LoadReport, ModelInfo, ServingStatus, TokenChunk
from calculet.common.errors import CalculetError, ErrorKind, Unavailable
from calculet.common.phase_clock import PhaseClock

# How long a single call (Submit, GetModel, Cancel) may take before the board counts as unreachable.
CALL_TIMEOUT_S = 10.0
_CREDENTIAL_KINDS = frozenset({ErrorKind.UNAUTHENTICATED, ErrorKind.PERMISSION_DENIED})


@dataclass(frozen=True)
class ChoiceSubmit:
    """What the gateway submits for one choice: the same on every board it may be sent to.

    Attributes:
        model: alias.
        prompt_tokens: the tokenized prompt.
        sampling: with the seed always set (failover must resend the same seed).
        max_tokens: completion budget (resume tokens count toward it); None = up to the context.
        stop_token_ids: extra stop ids; ignore_eos: do not stop at EOS.
        priority: lower is served first.
        session_id: affinity key ("" = none).
    """

    model: str
    prompt_tokens: tuple[int, ...]
    sampling: SamplingParams
    max_tokens: int | None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    priority: int = 0
    session_id: str = ""


@dataclass(frozen=True)
class ModelSwitch:
    """A placement switch: load `alias` from `package` (a path under the daemons' models root)
    replacing exactly `from_alias`@`from_generation` (compare-and-swap), or onto a board that
    holds no model when `from_alias` is None."""

    alias: str
    package: str
    from_alias: str | None
    from_generation: int
    reason: str
    requester: str


@dataclass(frozen=True)
class SwitchDone:
    """A switch that published `generation`; `phases`: seconds per phase as the gateway saw the
    progress stream (`common.phase_clock.PHASES`)."""

    generation: int
    phases: dict[str, float] = field(default_factory=dict)


class DaemonStream(abc.ABC):
    """One running job's event stream on one daemon. Owned by one reader."""

    @abc.abstractmethod
    def chunks(self) -> AsyncIterator[TokenChunk]:
        """Token chunks as they arrive; ends after the Final.

        Raises:
            CalculetError: the stream broke (Unavailable: the board is gone) or the job failed
                (the Final's typed error).
        """

    @property
    @abc.abstractmethod
    def final(self) -> FinalEvent | None:
        """The Final, once the iteration ended normally or with the job's own error."""

    @abc.abstractmethod
    async def cancel(self) -> None:
        """Cancel the job on the daemon; never raises (the board may be gone already)."""

    @abc.abstractmethod
    async def aclose(self) -> None:
        """Stop reading (does not cancel the job)."""


class DaemonConnection(abc.ABC):
    """What the gateway calls on one board daemon."""

    target: str

    @abc.abstractmethod
    async def start(
        self, job: ChoiceSubmit, resume_tokens: Sequence[int], metadata: Sequence[tuple[str, str]] = ()
    ) -> DaemonStream:
        """Submit the job (continuing after `resume_tokens`) and open its Wait stream.

        Args:
            job: what to generate.
            resume_tokens: tokens earlier attempts delivered.
            metadata: extra Submit metadata: `x-request-id` and W3C trace context (`serving.tracing`).
        Returns:
            The job's stream.
        Raises:
            CalculetError: Submit refused (InvalidArgument, NotFound, Overloaded, Unavailable...).
        """

    @abc.abstractmethod
    async def get_model(self, alias: str) -> ModelInfo:
        """GetModel. Raises: CalculetError (NotFound, Unavailable)."""

    @abc.abstractmethod
    def watch_load(self) -> AsyncIterator[LoadReport]:
        """WatchLoad reports. Raises: CalculetError when the stream breaks."""

    @abc.abstractmethod
    def watch_health(self) -> AsyncIterator[ServingStatus]:
        """grpc.health.v1 Watch of the whole board. Raises: CalculetError when it breaks."""

    @abc.abstractmethod
    async def switch_model(self, switch: ModelSwitch) -> SwitchDone:
        """Run `switch` on the board and wait until the new generation serves.

        Returns:
            The published generation and the phases' seconds.
        Raises:
            CalculetError: Aborted (the board no longer serves what the switch expected: another
                switch won), FailedPrecondition (refused: residency, an invalid package, one that
                does not fit; or the load failed and the old model was loaded back), Unavailable,
                PermissionDenied / Unauthenticated (no operate token).
        """

    @abc.abstractmethod
    async def close(self) -> None:
        """Close the channel; open streams end."""


class ClientStream(DaemonStream):
    """`DaemonStream` over a `calculet.client.AsyncGeneration`."""

    def __init__(self, generation: AsyncGeneration) -> None:
        self._gen = generation

    def chunks(self) -> AsyncIterator[TokenChunk]:
        return self._gen.chunks()

    @property
    def final(self) -> FinalEvent | None:
        return self._gen.final

    async def cancel(self) -> None:
        with contextlib.suppress(Exception):
            await self._gen.cancel()

    async def aclose(self) -> None:
        await self._gen.aclose()


class ClientConnection(DaemonConnection):
    """`DaemonConnection` over `AsyncDaemonClient`. Construct inside the running event loop.

    Args:
        target: the daemon's address (`unix:PATH` or `host:port`).
        load_interval_ms: WatchLoad period (reports also come at once on state changes).
        token: bearer token sent on every call (the gateway's inference-plane token), or None.
        tls: TLS to the daemon (its files are read now), or None for plaintext.
        operate_token: the operate-plane token sent with switches (None: the inference token).

    Raises:
        InvalidArgument: a bad target, token or TLS file.
    """

    def __init__(
        self,
        target: str,
        *,
        load_interval_ms: int = 1000,
        token: str | None = None,
        tls: TlsConfig | None = None,
        operate_token: str | None = None,
    ) -> None:
        self.target = target
        self._client = AsyncDaemonClient(target, timeout=CALL_TIMEOUT_S, max_reattach=0, token=token, tls=tls)
        self._interval_ms = load_interval_ms
        self._operate: AsyncDaemonClient | None = None
        self._operate_settings = (operate_token if operate_token is not None else token, tls)

    async def start(
        self, job: ChoiceSubmit, resume_tokens: Sequence[int], metadata: Sequence[tuple[str, str]] = ()
    ) -> DaemonStream:
        try:
            gen = await self._client.generate(
                job.model,
                job.prompt_tokens,
                max_tokens=job.max_tokens,
                sampling=job.sampling,
                stop_token_ids=job.stop_token_ids,
                ignore_eos=job.ignore_eos,
                priority=job.priority,
                resume_tokens=tuple(resume_tokens),
                session_id=job.session_id,
                call_metadata=metadata,
            )
        except CalculetError as err:
            raise self._board_refusal(err) from err
        return ClientStream(gen)

    async def get_model(self, alias: str) -> ModelInfo:
        try:
            return await self._client.get_model(alias)
        except CalculetError as err:
            raise self._board_refusal(err) from err

    def _board_refusal(self, err: CalculetError) -> CalculetError:
        """`err`, or Unavailable when the daemon refused the gateway's own credentials."""
        if err.kind not in _CREDENTIAL_KINDS:
            return err
        return Unavailable(
            f"daemon {self.target} refused the gateway's credentials ({err}); "
            "check --daemon-token-file (an inference-plane token of that daemon)"
        )

    def watch_load(self) -> AsyncIterator[LoadReport]:
        return self._client.watch_load(self._interval_ms)

    def watch_health(self) -> AsyncIterator[ServingStatus]:
        return self._client.watch_health("")

    async def switch_model(self, switch: ModelSwitch) -> SwitchDone:
        if self._operate is None:
            token, tls = self._operate_settings
            self._operate = AsyncDaemonClient(self.target, timeout=CALL_TIMEOUT_S, token=token, tls=tls)
        expected = None
        if switch.from_alias is not None:
            expected = Switch(
                switch.from_alias, switch.from_generation, reason=switch.reason, requester=switch.requester
            )
        clock = PhaseClock(switch.from_generation if expected is not None else -1)
        last = None
        calls = self._operate.load(switch.alias, switch.package, switch=expected)
        async with contextlib.aclosing(calls) as stream:  # type: ignore[type-var]
            async for last in stream:
                clock.seen(last.generation, model_state_from_pb(last.state))
                if last.done:
                    break
        done = load_outcome(last, switch.alias)
        return SwitchDone(done.generation, clock.seconds())

    async def close(self) -> None:
        if self._operate is not None:
            await self._operate.close()
        await self._client.close()
