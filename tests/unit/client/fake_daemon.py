"""An in-process fake of `calculet.v1.Daemon` for the client and calctl tests.

`FakeDaemon` implements `daemon_pb2_grpc.DaemonServicer` with canned but protocol-faithful
behaviour: the refusals each RPC documents (NOT_FOUND, INVALID_ARGUMENT, FAILED_PRECONDITION,
UNAVAILABLE ...), jobs whose Wait streams follow the index/first_index rules and end with one
Final, Load streams through the lifecycle, and a realistic StatusResponse. Tests steer it through
plain attributes (`script`, `fail`, `packages`, `models`, ...), block a stream at an event with a
`threading.Event` gate, and break a stream with UNAVAILABLE at an event index once. Every call is
recorded with its request and metadata (`calls`). Beside it runs the standard `grpc.health.v1`
servicer (`health`), which tests set directly (the fake starts with "" SERVING).

Ownership: gRPC's server threads run the handlers; every mutable field is guarded by `lock`.
"""

from __future__ import annotations

import contextlib
import queue
import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, NoReturn

import grpc
from google.protobuf.timestamp_pb2 import Timestamp
from grpc_health.v1 import health, health_pb2

from calculet.client import Event, TokenChunk
from calculet.v1 import common_pb2, daemon_pb2_grpc, inference_pb2, observe_pb2, operate_pb2

VOCAB = 1000
DEFAULT_MAX_TOKENS = 6
DAEMON_SEED = 4242  # the seed the fake "picks" when a request has none
PIECE_BYTES = 1 << 20  # GetModel's pieces of tokenizer.json
GATE_TIMEOUT_S = 10.0  # a gate nobody opens fails the stream instead of hanging the suite
ALIAS = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}")
M = common_pb2


def completion_tokens(prompt: list[int], start: int, count: int) -> list[int]:
    """The fake model: token i of the completion is a function of the prompt and i only."""
    base = sum(prompt)
    return [(base + 7 * i + 3) % VOCAB for i in range(start, start + count)]


def tokens_of(events: list[Event]) -> list[int]:
    """Every token of a job's client events, in order."""
    return [tok for e in events if isinstance(e, TokenChunk) for tok in e.tokens]


def chunk_event(index: int, first_index: int, tokens: list[int]) -> inference_pb2.WaitEvent:
    return inference_pb2.WaitEvent(index=index, tokens=inference_pb2.TokenChunk(first_index=first_index, tokens=tokens))


def final_event(
    index: int,
    reason: int = inference_pb2.FINISH_REASON_LENGTH,
    *,
    prompt: int = 0,
    completion: int = 0,
    error: common_pb2.ErrorStatus | None = None,
    generation: int = 1,
    recoveries: int = 0,
) -> inference_pb2.WaitEvent:
    final = inference_pb2.Final(
        finish_reason=reason,
        usage=inference_pb2.Usage(prompt_tokens=prompt, completion_tokens=completion),
        timings=inference_pb2.Timings(queue_s=0.001, prefill_s=0.01, ttft_s=0.011, decode_s=0.02, e2e_s=0.031),
        generation=generation,
        recoveries=recoveries,
    )
    if error is not None:
        final.error.CopyFrom(error)
    return inference_pb2.WaitEvent(index=index, final=final)


def default_script(req: inference_pb2.SubmitRequest, generation: int) -> list[inference_pb2.WaitEvent]:
    """Tokens in chunks of two from position len(resume_tokens), then a LENGTH Final."""
    resumed = len(req.resume_tokens)
    total = req.stopping.max_tokens if req.stopping.HasField("max_tokens") else DEFAULT_MAX_TOKENS
    new = completion_tokens(list(req.prompt_tokens), resumed, total - resumed)
    events = [chunk_event(i, resumed + 2 * i, new[2 * i : 2 * i + 2]) for i in range((len(new) + 1) // 2)]
    events.append(final_event(len(events), prompt=len(req.prompt_tokens), completion=total, generation=generation))
    return events


@dataclass
class FakeModel:
    alias: str
    package: str
    generation: int
    state: int = M.MODEL_STATE_READY
    lanes: int = 4


@dataclass
class FakeJob:
    job_id: str
    request: inference_pb2.SubmitRequest
    events: list[inference_pb2.WaitEvent]
    breaks: set[int] = field(default_factory=set)  # abort UNAVAILABLE once before sending event i
    gates: dict[int, threading.Event] = field(default_factory=dict)  # wait before sending event i
    lost_on_break: bool = False  # a break also forgets the job (the daemon "restarted")
    cancelled: bool = False


@dataclass(frozen=True)
class Failure:
    code: grpc.StatusCode
    details: str
    trailing: tuple[tuple[str, str], ...] = ()


Script = Callable[[inference_pb2.SubmitRequest, int], list[inference_pb2.WaitEvent]]


class FakeDaemon(daemon_pb2_grpc.DaemonServicer):
    """Canned daemon; see the module docstring."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.models: dict[str, FakeModel] = {"tiny": FakeModel("tiny", "packages/tiny", generation=3)}
        self.packages: dict[str, str | None] = {
            "packages/tiny": None,
            "packages/broken": "param_blk0.bin: hash mismatch",
        }
        self.jobs: dict[str, FakeJob] = {}
        self.fail: dict[str, Failure] = {}  # method -> status every call of it fails with
        self.calls: list[tuple[str, Any, dict[str, str]]] = []
        self.script: Script = default_script
        self.next_breaks: set[int] = set()  # applied to the next submitted job
        self.next_gates: dict[int, threading.Event] = {}
        self.next_lost_on_break = False
        self.draining = False
        self.remaining_jobs = 0
        self.fault_injection = True
        self.planned_faults = 0
        self.tokenizer_json = b'{"version": "1.0", "model": {"type": "BPE"}}'
        self.load_reports = 5
        self.health = health.HealthServicer()
        self.health.set("", health_pb2.HealthCheckResponse.SERVING)
        self._job_counter = 0
        self._generation = 3

    # ---- helpers for tests -------------------------------------------------------------

    def calls_of(self, method: str) -> list[tuple[Any, dict[str, str]]]:
        with self.lock:
            return [(req, md) for name, req, md in self.calls if name == method]

    def open_all_gates(self) -> None:
        with self.lock:
            gates = [g for job in self.jobs.values() for g in job.gates.values()] + list(self.next_gates.values())
        for gate in gates:
            gate.set()

    # ---- plumbing ----------------------------------------------------------------------

    def _enter(self, method: str, request: Any, context: grpc.ServicerContext) -> None:
        metadata = {key: value for key, value in context.invocation_metadata() if isinstance(value, str)}
        with self.lock:
            self.calls.append((method, request, metadata))
            failure = self.fail.get(method)
        if failure is not None:
            _abort(context, failure.code, failure.details, failure.trailing)

    def _model(self, alias: str, context: grpc.ServicerContext) -> FakeModel:
        with self.lock:
            model = self.models.get(alias)
        if model is None:
            _abort(context, grpc.StatusCode.NOT_FOUND, f"model {alias!r} is not loaded")
        return model

    def _job(self, job_id: str, context: grpc.ServicerContext) -> FakeJob:
        with self.lock:
            job = self.jobs.get(job_id)
        if job is None:
            _abort(context, grpc.StatusCode.NOT_FOUND, f"job {job_id!r} is unknown or expired")
        return job

    def _health(self) -> observe_pb2.HealthResponse:
        ready = any(m.state == M.MODEL_STATE_READY for m in self.models.values())
        if self.draining:
            status, reason = M.SERVING_STATUS_DRAINING, "the board is draining"
        elif ready:
            status, reason = M.SERVING_STATUS_SERVING, ""
        else:
            status, reason = M.SERVING_STATUS_NOT_SERVING, "no model is READY"
        models = [
            observe_pb2.ModelHealth(
                alias=m.alias,
                status=status if m.state == M.MODEL_STATE_READY else M.SERVING_STATUS_NOT_SERVING,
                state=m.state,
                generation=m.generation,
            )
            for m in sorted(self.models.values(), key=lambda m: m.alias)
        ]
        budget = observe_pb2.ResetBudget(used=1, limit=3, window_s=600.0)
        return observe_pb2.HealthResponse(
            status=status,
            device_healthy=True,
            models=models,
            reset_budget=budget,
            reason=reason,
        )

    # ---- inference plane ---------------------------------------------------------------

    def Submit(self, request: inference_pb2.SubmitRequest, context: grpc.ServicerContext) -> Any:
        self._enter("Submit", request, context)
        model = self._model(request.model, context)
        if self.draining or model.state != M.MODEL_STATE_READY:
            _abort(context, grpc.StatusCode.UNAVAILABLE, f"model {request.model!r} is not READY")
        if not request.prompt_tokens:
            _abort(context, grpc.StatusCode.INVALID_ARGUMENT, "prompt_tokens: must not be empty")
        for name in ("prompt_tokens", "resume_tokens"):
            for i, tok in enumerate(getattr(request, name)):
                if tok >= VOCAB:
                    _abort(context, grpc.StatusCode.INVALID_ARGUMENT, f"{name}[{i}]: token id {tok} >= {VOCAB}")
        if request.stopping.HasField("max_tokens") and request.stopping.max_tokens <= len(request.resume_tokens):
            _abort(context, grpc.StatusCode.INVALID_ARGUMENT, "max_tokens: must exceed len(resume_tokens)")
        with self.lock:
            self._job_counter += 1
            job_id = f"job-{self._job_counter}"
            job = FakeJob(
                job_id,
                request,
                self.script(request, model.generation),
                breaks=self.next_breaks,
                gates=self.next_gates,
                lost_on_break=self.next_lost_on_break,
            )
            self.next_breaks, self.next_gates, self.next_lost_on_break = set(), {}, False
            self.jobs[job_id] = job
        seed = request.sampling.seed if request.sampling.HasField("seed") else DAEMON_SEED
        return inference_pb2.SubmitResponse(job_id=job_id, seed=seed, generation=model.generation)

    def Wait(self, request: inference_pb2.WaitRequest, context: grpc.ServicerContext) -> Iterator[Any]:
        self._enter("Wait", request, context)
        job = self._job(request.job_id, context)
        if request.from_event_index > len(job.events):
            _abort(context, grpc.StatusCode.INVALID_ARGUMENT, "from_event_index: beyond the events produced")
        for i in range(request.from_event_index, len(job.events)):
            with self.lock:
                broken = i in job.breaks
                job.breaks.discard(i)
                if broken and job.lost_on_break:
                    self.jobs.pop(job.job_id, None)
            if broken:
                _abort(context, grpc.StatusCode.UNAVAILABLE, "Socket closed")
            gate = job.gates.get(i)
            if gate is not None and not gate.wait(GATE_TIMEOUT_S):
                _abort(context, grpc.StatusCode.INTERNAL, f"fake: gate before event {i} never opened")
            yield job.events[i]

    def Follow(self, requests: Iterator[inference_pb2.FollowRequest], context: grpc.ServicerContext) -> Iterator[Any]:
        """Each attachment runs `Wait` (recorded as a Wait call, with its gates, breaks and
        failures) on a thread of its own; a refusal Wait answers with NOT_FOUND or
        INVALID_ARGUMENT goes in-band, any other abort (a break: UNAVAILABLE) ends the stream."""
        context.send_initial_metadata(())  # as the daemon does: clients write once they see it
        out: queue.Queue[tuple[str, int, Any]] = queue.Queue()

        def attachment(follow_id: int, wait: inference_pb2.WaitRequest) -> None:
            try:
                for event in self.Wait(wait, _AttachmentContext(context)):
                    out.put(("event", follow_id, event))
                    if event.HasField("final"):
                        return
                out.put(("ended", follow_id, None))
            except _Aborted as aborted:
                out.put(("refused" if aborted.code in IN_BAND_CODES else "abort", follow_id, aborted))
            finally:
                out.put(("over", follow_id, None))

        def read_requests() -> None:
            with contextlib.suppress(grpc.RpcError, ValueError):
                for request in requests:
                    if request.HasField("attach"):
                        out.put(("attached", 0, None))
                        args = (request.attach.follow_id, request.attach.wait)
                        threading.Thread(target=attachment, args=args, daemon=True).start()
            out.put(("half-closed", 0, None))

        threading.Thread(target=read_requests, daemon=True).start()
        context.add_callback(lambda: out.put(("closed", 0, None)))  # the call ended (the client cancelled)
        live, half_closed = 0, False
        while True:
            kind, follow_id, value = out.get()
            if kind == "closed":
                return
            if kind in ("attached", "over", "half-closed"):
                live += {"attached": 1, "over": -1, "half-closed": 0}[kind]
                half_closed = half_closed or kind == "half-closed"
                if half_closed and live == 0:
                    return  # the client is done and nothing is attached: end the stream OK, as the daemon does
                continue
            reply = inference_pb2.FollowReply()
            update = reply.updates.add(follow_id=follow_id)
            if kind == "event":
                update.events.append(value)
            elif kind == "refused":
                update.error.CopyFrom(common_pb2.ErrorStatus(kind=IN_BAND_CODES[value.code], message=value.details))
            elif kind == "abort":
                _abort(context, value.code, value.details, value.trailing)
            yield reply

    def Cancel(self, request: inference_pb2.CancelRequest, context: grpc.ServicerContext) -> Any:
        self._enter("Cancel", request, context)
        job = self._job(request.job_id, context)
        with self.lock:
            already, job.cancelled = job.cancelled, True
        return inference_pb2.CancelResponse(already_finished=already)

    # ---- observation plane -------------------------------------------------------------

    def Health(self, request: observe_pb2.HealthRequest, context: grpc.ServicerContext) -> Any:
        self._enter("Health", request, context)
        with self.lock:
            return self._health()

    def Status(self, request: observe_pb2.StatusRequest, context: grpc.ServicerContext) -> Any:
        self._enter("Status", request, context)
        with self.lock:
            return status_response(self)

    def WatchLoad(self, request: observe_pb2.WatchLoadRequest, context: grpc.ServicerContext) -> Iterator[Any]:
        self._enter("WatchLoad", request, context)
        if request.interval_ms != 0 and not 50 <= request.interval_ms <= 60000:
            _abort(context, grpc.StatusCode.INVALID_ARGUMENT, "interval_ms: must be 0 or 50..60000")
        for sequence in range(self.load_reports):
            with self.lock:
                models = [
                    observe_pb2.ModelLoad(
                        alias=m.alias, generation=m.generation, state=m.state,
                        ready=m.state == M.MODEL_STATE_READY, queue_depth=sequence, running=1,
                        free_lanes=m.lanes - 1, lanes_total=m.lanes,
                    )
                    for m in sorted(self.models.values(), key=lambda m: m.alias)
                ]  # fmt: skip
                status = self._health().status
            yield observe_pb2.LoadReport(board="fake-0", status=status, models=models, sequence=sequence)
        # A real daemon never ends this stream: hold it open until the client goes away.
        gone = threading.Event()
        context.add_callback(gone.set)
        gone.wait(GATE_TIMEOUT_S)

    def GetModel(self, request: observe_pb2.GetModelRequest, context: grpc.ServicerContext) -> Iterator[Any]:
        self._enter("GetModel", request, context)
        model = self._model(request.alias, context)
        summary = observe_pb2.ModelSummary(
            alias=model.alias, generation=model.generation, state=model.state,
            package_name="tiny", package_hash="ab" * 32, model_role="llm", family="qwen3_moe",
            quantization="bf16", vocab_size=VOCAB, context=256, lanes=model.lanes, eos_token_ids=[2],
            bos_token_id=1, model_max_length=256,
        )  # fmt: skip
        data = self.tokenizer_json
        yield observe_pb2.GetModelResponse(
            model=summary, tokenizer_json=data[:PIECE_BYTES], chat_template="{{ messages }}", tokenizer_size=len(data)
        )
        for start in range(PIECE_BYTES, len(data), PIECE_BYTES):  # the rest in pieces, as a daemon sends it
            yield observe_pb2.GetModelResponse(tokenizer_json=data[start : start + PIECE_BYTES])

    # ---- operations plane --------------------------------------------------------------

    def Load(self, request: operate_pb2.LoadRequest, context: grpc.ServicerContext) -> Iterator[Any]:
        self._enter("Load", request, context)
        if not ALIAS.fullmatch(request.alias):
            _abort(context, grpc.StatusCode.INVALID_ARGUMENT, f"alias {request.alias!r}: not a valid alias")
        if not request.package or request.package.startswith("/") or ".." in request.package.split("/"):
            _abort(context, grpc.StatusCode.INVALID_ARGUMENT, f"package {request.package!r}: must stay in the root")
        with self.lock:
            known = request.package in self.packages
            problem = self.packages.get(request.package)
            existing = self.models.get(request.alias)
            self._generation += 1
            generation = self._generation
        if not known:
            _abort(context, grpc.StatusCode.NOT_FOUND, f"package {request.package!r}: no such directory")
        if existing is not None and not request.options.replace:
            _abort(context, grpc.StatusCode.FAILED_PRECONDITION, f"alias {request.alias!r} is loaded; use replace")

        def progress(state: int, message: str, elapsed: float, **kw: Any) -> operate_pb2.LoadProgress:
            return operate_pb2.LoadProgress(
                state=state, generation=generation, message=message, elapsed_s=elapsed, **kw
            )

        yield progress(M.MODEL_STATE_VALIDATING, "checking manifest and hashes", 0.01)
        if problem is not None:
            error = common_pb2.ErrorStatus(kind=common_pb2.ERROR_KIND_FAILED_PRECONDITION, message=problem)
            yield progress(M.MODEL_STATE_FAILED, "validation failed", 0.02, done=True, error=error)
            return
        yield progress(M.MODEL_STATE_CONFIGURING, "configuring 2 chips", 0.05)
        yield progress(M.MODEL_STATE_WARMING, "golden prefill/decode", 0.08)
        with self.lock:
            self.models[request.alias] = FakeModel(request.alias, request.package, generation)
        yield progress(M.MODEL_STATE_READY, "published", 0.1, done=True)

    def Unload(self, request: operate_pb2.UnloadRequest, context: grpc.ServicerContext) -> Any:
        self._enter("Unload", request, context)
        model = self._model(request.alias, context)
        with self.lock:
            self.models.pop(request.alias, None)
        interrupted = 1 if request.HasField("drain_timeout_ms") and request.drain_timeout_ms == 0 else 0
        return operate_pb2.UnloadResponse(generation=model.generation, drained_jobs=2, interrupted_jobs=interrupted)

    def Drain(self, request: operate_pb2.DrainRequest, context: grpc.ServicerContext) -> Any:
        self._enter("Drain", request, context)
        with self.lock:
            self.draining = True
            interrupted = self.remaining_jobs if request.interrupt_remaining else 0
            remaining = self.remaining_jobs - interrupted
        return operate_pb2.DrainResponse(drained=remaining == 0, remaining_jobs=remaining, interrupted_jobs=interrupted)

    def Resume(self, request: operate_pb2.ResumeRequest, context: grpc.ServicerContext) -> Any:
        self._enter("Resume", request, context)
        with self.lock:
            was, self.draining = self.draining, False
        return operate_pb2.ResumeResponse(was_draining=was)

    def Reset(self, request: operate_pb2.ResetRequest, context: grpc.ServicerContext) -> Any:
        self._enter("Reset", request, context)
        if request.kind == M.RESET_KIND_UNSPECIFIED:
            _abort(context, grpc.StatusCode.INVALID_ARGUMENT, "kind: required")
        if not 1 <= len(request.reason.encode()) <= 256:
            _abort(context, grpc.StatusCode.INVALID_ARGUMENT, "reason: 1..256 bytes")
        if request.model and request.kind != M.RESET_KIND_CONFIGURATION:
            _abort(context, grpc.StatusCode.INVALID_ARGUMENT, "model: only with kind CONFIGURATION")
        if request.model:
            self._model(request.model, context)
        with self.lock:
            changes = []
            for m in self.models.values():
                if not request.model or m.alias == request.model:
                    self._generation += 1
                    changes.append(
                        operate_pb2.GenerationChange(alias=m.alias, before=m.generation, after=self._generation)
                    )
                    m.generation = self._generation
        return operate_pb2.ResetResult(
            ok=True, kind=request.kind, reason=request.reason, health_before=M.SERVING_STATUS_SERVING,
            health_after=M.SERVING_STATUS_SERVING, inflight_jobs=2, recovered_jobs=2, generations=changes,
            duration_s=0.4,
        )  # fmt: skip

    def InjectFault(self, request: operate_pb2.InjectFaultRequest, context: grpc.ServicerContext) -> Any:
        self._enter("InjectFault", request, context)
        if not self.fault_injection:
            _abort(context, grpc.StatusCode.FAILED_PRECONDITION, "fault injection is disabled")
        if request.HasField("fault") and request.fault.kind == operate_pb2.FAULT_KIND_UNSPECIFIED:
            _abort(context, grpc.StatusCode.INVALID_ARGUMENT, "fault.kind: required")
        with self.lock:
            if request.clear_existing:
                self.planned_faults = 0
            self.planned_faults += 1 if request.HasField("fault") else 0
            planned = self.planned_faults
        return operate_pb2.InjectFaultResponse(next_job_index=17, planned_faults=planned)


def status_response(fake: FakeDaemon) -> observe_pb2.StatusResponse:
    """A full board picture: 2 chips, the fake's models with 5 lanes in every lane state, 2 jobs."""
    started = Timestamp(seconds=1_790_000_000)
    lanes = [
        observe_pb2.LaneStatus(index=0, state=observe_pb2.LANE_STATE_ACTIVE, job_id="job-7", kv_length=37),
        observe_pb2.LaneStatus(index=1, state=observe_pb2.LANE_STATE_RESERVED, job_id="job-8", kv_length=0),
        observe_pb2.LaneStatus(index=2, state=observe_pb2.LANE_STATE_FREE),
        observe_pb2.LaneStatus(index=3, state=observe_pb2.LANE_STATE_UNKNOWN, job_id="job-9"),
        observe_pb2.LaneStatus(index=4, state=observe_pb2.LANE_STATE_PARKED, kv_length=50, parked_s=3.5),
    ]
    prefix = observe_pb2.PrefixCacheStatus(enabled=True, min_tokens=16, parked_lanes=1, hit_tokens=120, miss_tokens=30)
    models = [
        observe_pb2.ModelStatus(
            alias=m.alias, generation=m.generation, state=m.state, package_name=m.alias,
            package_hash="cd" * 32, package_path=m.package, lanes=lanes,
            queues=observe_pb2.QueueDepths(decode_ready=1, short_prefill=2, long_prefill=5), ready_at=started,
            prefix_cache=prefix, prefill_chunk_tokens=64,
        )
        for m in sorted(fake.models.values(), key=lambda m: m.alias)
    ]  # fmt: skip
    gib = 1 << 30
    return observe_pb2.StatusResponse(
        board=observe_pb2.BoardInfo(
            name="fake-0", index=0, daemon_version="0.1.0", started_at=started, driver="calsim", fault_injection=True
        ),
        device=observe_pb2.DeviceInfo(
            name="calsim", board_index=0, runtime_version="0.7.6", driver_version="1.2.0", firmware_version="3.4",
            chips=[
                observe_pb2.ChipInfo(index=i, dram_total_bytes=16 * gib, dram_used_bytes=(9 + i) * gib,
                                     sram_total_bytes=64 << 20, sram_used_bytes=48 << 20)
                for i in range(2)
            ],
            capabilities=observe_pb2.DeviceCapabilities(max_inflight=2, ping_pong=True, max_resident_configurations=1),
        ),
        models=models,
        jobs=[
            observe_pb2.JobSummary(job_id="job-7", model="tiny", generation=3, state=observe_pb2.JOB_STATE_DECODE,
                                   lane=0, prompt_tokens=30, completion_tokens=7, age_s=1.5),
            observe_pb2.JobSummary(job_id="job-10", model="tiny", generation=3, state=observe_pb2.JOB_STATE_QUEUED,
                                   prompt_tokens=900, priority=-5, age_s=0.2, client_request_id="req-a"),
        ],
        device_counters=observe_pb2.DeviceJobCounters(submitted=120, pending=1, running=1, finished=118, left=2),
        job_counters=observe_pb2.JobCounters(accepted=40, rejected=3, completed=30, cancelled=2, failed=1,
                                             recoveries=4),
        buffer_pool=observe_pb2.BufferPoolStatus(in_use=2, free=6, quarantined=1, waits=5),
        resets=observe_pb2.ResetSummary(
            count=1, last_reason="ccu exception on job 57", last_kind=M.RESET_KIND_CCU, last_at=started,
            last_ok=True, budget=observe_pb2.ResetBudget(used=1, limit=3, window_s=600.0),
        ),
        policy=observe_pb2.POLICY_CONTINUOUS,
        max_inflight=2,
        inflight_submissions=1,
        draining=fake.draining,
        health=fake._health().status,
    )  # fmt: skip


def _abort(
    context: grpc.ServicerContext, code: grpc.StatusCode, details: str, trailing: tuple[tuple[str, str], ...] = ()
) -> NoReturn:
    if trailing:
        context.set_trailing_metadata(trailing)
    context.abort(code, details)
    raise AssertionError("unreachable: context.abort raises")


# The refusals a Follow attachment gets in-band (daemon.proto Follow), as the ErrorKind they carry.
IN_BAND_CODES = {
    grpc.StatusCode.NOT_FOUND: common_pb2.ERROR_KIND_NOT_FOUND,
    grpc.StatusCode.INVALID_ARGUMENT: common_pb2.ERROR_KIND_INVALID_ARGUMENT,
}


class _Aborted(Exception):
    def __init__(self, code: grpc.StatusCode, details: str, trailing: tuple[tuple[str, str], ...]) -> None:
        super().__init__(details)
        self.code, self.details, self.trailing = code, details, trailing


class _AttachmentContext:
    """The Follow call's context as one attachment's Wait sees it: aborting ends the attachment."""

    def __init__(self, call: grpc.ServicerContext) -> None:
        self._call = call
        self._trailing: tuple[tuple[str, str], ...] = ()

    def invocation_metadata(self) -> Any:
        return self._call.invocation_metadata()

    def set_trailing_metadata(self, trailing: tuple[tuple[str, str], ...]) -> None:
        self._trailing = trailing

    def abort(self, code: grpc.StatusCode, details: str) -> NoReturn:
        raise _Aborted(code, details, self._trailing)
