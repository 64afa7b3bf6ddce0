"""`GatewayMetrics`: the gateway's own metrics (docs/metrics.md), rendered at `GET /metrics`.

Data flow: the ASGI middleware (`middleware.py`) records each HTTP request's route, status and
duration; `watch` wraps a prepared request's choice events and records its time to the first visible
text and its tokens; the serving layer reports retries, failovers and the answer memory's hits,
misses and fallbacks (`ServingObserver`); placement by demand reports its switches (with each
phase's seconds) and each request's wait for a model (`PlacementObserver`); board gauges are read
from the fleet, the answer memory's size from the memory, the queues from the placer, at each
scrape. Everything runs on the event loop, so nothing here
locks. One `MetricsRegistry` per app: no global OpenTelemetry or prometheus_client state.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Iterable, Mapping

from opentelemetry.metrics import CallbackOptions, Observation

from calculet.common.telemetry.registry import CONTENT_TYPE, LATENCY_BUCKETS_S, MetricsRegistry, package_version
from calculet.gateway.fleet.board import BoardState
from calculet.gateway.fleet.fleet import Fleet
from calculet.gateway.placement.placer import ModelPlacer, PlacementObserver
from calculet.gateway.serving.choice import ChoiceDelta, ChoiceEnd, ChoiceEvent
from calculet.gateway.serving.observer import ServingObserver
from calculet.gateway.text.answer_memory import AnswerMemory

Events = AsyncIterator[tuple[int, ChoiceEvent]]


SWITCH_BUCKETS_S = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300)


class GatewayMetrics(ServingObserver, PlacementObserver):
    """The instruments of one gateway app; `attach` the fleet (and the answer memory) before
    scrapes report boards (and the memory's size)."""

    def __init__(self) -> None:
        self._registry = MetricsRegistry("calculet-gateway")
        meter = self._registry.meter
        self._fleet: Fleet | None = None
        self._answers: AnswerMemory | None = None
        self._placer: ModelPlacer | None = None
        self._requests = meter.create_counter("calculet_gateway_requests_total", description="HTTP requests answered")
        self._e2e = meter.create_histogram(
            "calculet_gateway_e2e_request_latency_seconds",
            unit="s",
            description="Completion requests: arrival to the last byte sent",
            explicit_bucket_boundaries_advisory=LATENCY_BUCKETS_S,
        )
        self._ttft = meter.create_histogram(
            "calculet_gateway_time_to_first_token_seconds",
            unit="s",
            description="Completion requests: arrival to the first visible text",
            explicit_bucket_boundaries_advisory=LATENCY_BUCKETS_S,
        )
        self._prompt = meter.create_counter("calculet_gateway_prompt_tokens_total", description="Prompt tokens")
        self._generated = meter.create_counter(
            "calculet_gateway_generation_tokens_total", description="Completion tokens of finished choices"
        )
        self._retries = meter.create_counter("calculet_gateway_retries_total", description="Resubmits before a token")
        self._failovers = meter.create_counter("calculet_gateway_failovers_total", description="Mid-stream resumes")
        self._answer_hits = meter.create_counter(
            "calculet_gateway_answer_memory_hits_total", description="Assistant messages spliced as remembered ids"
        )
        self._answer_misses = meter.create_counter(
            "calculet_gateway_answer_memory_misses_total", description="Assistant messages the memory did not hold"
        )
        self._answer_fallbacks = meter.create_counter(
            "calculet_gateway_answer_memory_fallbacks_total",
            description="Chat prompts encoded plainly because the template changed the placeholders",
        )
        meter.create_observable_gauge(
            "calculet_gateway_answer_memory_tokens",
            callbacks=[self._answer_tokens],
            description="Token ids the answer memory holds",
        )
        meter.create_observable_gauge(
            "calculet_gateway_answer_memory_entries",
            callbacks=[self._answer_entries],
            description="Answers the answer memory holds",
        )
        meter.create_observable_gauge(
            "calculet_gateway_board_up", callbacks=[self._board_up], description="1 while the board's streams flow"
        )
        meter.create_observable_gauge(
            "calculet_gateway_board_jobs", callbacks=[self._board_jobs], description="Choices running on the board"
        )
        meter.create_observable_gauge(
            "calculet_gateway_boards", callbacks=[self._boards], description="Boards per connection state"
        )
        meter.create_observable_gauge(
            "calculet_gateway_build_info", callbacks=[self._build_info], description="Gateway version"
        )
        self._switches = meter.create_counter(
            "calculet_gateway_model_switches_total", description="Model placement's switches by target model and result"
        )
        self._switch_phase = meter.create_histogram(
            "calculet_gateway_model_switch_phase_seconds",
            unit="s",
            description="Seconds of each phase of placement's successful switches",
            explicit_bucket_boundaries_advisory=SWITCH_BUCKETS_S,
        )
        self._model_wait = meter.create_histogram(
            "calculet_gateway_model_wait_seconds",
            unit="s",
            description="Seconds requests waited for their model to get a board, by outcome",
            explicit_bucket_boundaries_advisory=SWITCH_BUCKETS_S,
        )
        meter.create_observable_gauge(
            "calculet_gateway_model_queued", callbacks=[self._queued], description="Requests waiting for a board"
        )

    def attach(self, fleet: Fleet, answers: AnswerMemory | None = None, placer: ModelPlacer | None = None) -> None:
        """Report this fleet's boards (this answer memory's size, this placer's queues) from now on."""
        self._fleet = fleet
        self._answers = answers
        self._placer = placer

    def render(self) -> tuple[bytes, str]:
        """One scrape: (Prometheus text, its content type)."""
        return self._registry.render(), CONTENT_TYPE

    def close(self) -> None:
        self._registry.close()

    # ---- recording points ---------------------------------------------------------------

    def http_request(self, route: str, status: int, seconds: float | None) -> None:
        """An HTTP request was answered; `seconds` (completion routes) goes to the e2e histogram."""
        self._requests.add(1, {"route": route, "status": str(status)})
        if seconds is not None:
            self._e2e.record(seconds, {"route": route})

    async def watch(self, events: Events, model: str, prompt_tokens: int, started: float) -> Events:
        """`events`, passed through; records the first visible text's time (from `started`, a
        `time.perf_counter()`), the prompt tokens and each finished choice's tokens."""
        self._prompt.add(prompt_tokens, {"model": model})
        first = True
        async with contextlib.aclosing(events) as inner:  # type: ignore[type-var]
            async for index, event in inner:
                if first and isinstance(event, ChoiceDelta):
                    first = False
                    self._ttft.record(time.perf_counter() - started, {"model": model})
                elif isinstance(event, ChoiceEnd):
                    self._generated.add(event.completion_tokens, {"model": model})
                yield index, event

    def resubmitted(self, model: str, *, mid_stream: bool) -> None:
        (self._failovers if mid_stream else self._retries).add(1, {"model": model})

    def answers_recalled(self, model: str, *, spliced: int, missed: int, fallback: bool) -> None:
        attributes = {"model": model}
        self._answer_hits.add(spliced, attributes)
        self._answer_misses.add(missed, attributes)
        if fallback:
            self._answer_fallbacks.add(1, attributes)

    def model_switched(self, model: str, result: str, seconds: float, phases: Mapping[str, float]) -> None:
        self._switches.add(1, {"model": model, "result": result})
        for phase, phase_seconds in phases.items():
            self._switch_phase.record(phase_seconds, {"phase": phase})

    def model_waited(self, model: str, seconds: float, outcome: str) -> None:
        self._model_wait.record(seconds, {"model": model, "outcome": outcome})

    # ---- observable gauges (read at a scrape) -------------------------------------------

    def _queued(self, _: CallbackOptions) -> Iterable[Observation]:
        if self._placer is None:
            return []
        counts = self._placer.waiters.counts()
        return [Observation(counts.get(alias, 0), {"model": alias}) for alias in sorted(self._placer.catalog)]

    def _board_up(self, _: CallbackOptions) -> Iterable[Observation]:
        boards = self._fleet.boards.values() if self._fleet is not None else ()
        return [Observation(1.0 if b.state is BoardState.UP else 0.0, {"board": b.target}) for b in boards]

    def _board_jobs(self, _: CallbackOptions) -> Iterable[Observation]:
        boards = self._fleet.boards.values() if self._fleet is not None else ()
        return [Observation(b.placed, {"board": b.target}) for b in boards]

    def _boards(self, _: CallbackOptions) -> Iterable[Observation]:
        boards = list(self._fleet.boards.values()) if self._fleet is not None else []
        return [Observation(sum(1 for b in boards if b.state is s), {"state": s.value}) for s in BoardState]

    def _answer_tokens(self, _: CallbackOptions) -> Iterable[Observation]:
        return [Observation(self._answers.tokens)] if self._answers is not None else []

    def _answer_entries(self, _: CallbackOptions) -> Iterable[Observation]:
        return [Observation(self._answers.entries)] if self._answers is not None else []

    def _build_info(self, _: CallbackOptions) -> Iterable[Observation]:
        return [Observation(1.0, {"version": package_version()})]
