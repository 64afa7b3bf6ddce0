"""The daemon's domain core: one board's jobs, models and device work, with no transport
(docs/daemon.md draws who owns what; `README.md` beside this file says where a change goes).

- `device_core.DeviceCore`: the facade the servicer calls; builds views (`observe/views.py`) from snapshots.
- `engine.Engine`: owns every client job (`client_job.ClientJob`, `job_table`), model generation
  (`generations`; their operations are `generation_ops.GenerationOps`, handed out as
  `Engine.generations`), the `scheduler.Scheduler`, the `executor.Executor` and the board's reset
  controller, behind one lock;
  runs the engine and completion threads. Nothing outside it touches its state; `snapshot()` gives
  frozen views (`observe/snapshot.py`, built by `observe/snapshot_parts.py`). Its settings and answers:
  `engine_types`.
- `bookkeeping.Bookkeeper`: the engine's job and lane bookkeeping under its lock: queues jobs, moves
  them out of finished device jobs, ends them (parking or freeing lanes, `lane_closes` for the
  device), expires them (`expiry`), fails them at a halt.
- `resets/`: `controller.ResetController`, every reset and halt of the board (reset state IDLE ->
  AUTOMATIC_CCU / OPERATOR_CCU / OPERATOR_CONFIGURATION -> SETTLING -> IDLE; halt NONE /
  AWAITING_OPERATOR / LOST), the reset budget, gate, tally and audit trail (`budget`, `audit`),
  under the engine lock; it reaches the engine through `host.ResetHost`. `operator` runs an
  operator's Reset through its steps; `escalations` acts on repeated faults.
- `scheduler.Scheduler`: waiting / ready / recovering jobs and continuous batching; assigns and frees
  KV lanes (`kv.KVManager`, one per generation) and queues admission (`admission.AdmissionQueue`).
- `executor.Executor`: device jobs: reserves the planned rows' KV, fills a `job_buffers.JobContext`
  from the generation's `job_buffers.JobPool`, submits (outside the engine lock), commits or loses
  the rows.
- `completion`: what a finished device job means, decided without changing anything (`settle`).
- `models.ModelManager`: load, warm, publish, drain and unload generations through the engine.
- `observe/`: telemetry events and how the engine builds them (`observer`, `observer_records`), and
  the frozen snapshots and views of its state; `heartbeat`: the engine thread's liveness listeners.

Data flow: Submit -> engine queues the job -> scheduler plans a device job and hands it lanes ->
executor prepares (lock) and submits (no lock) -> completion thread waits, samples, settles ->
engine applies (tokens streamed, KV committed or lost, lanes freed) -> buffers back to the pool.
A hung job or a lost device goes to the reset controller, which holds launches, resets the device
(no lock) and marks what the reset hit (lock).
"""
