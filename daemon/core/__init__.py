"""The daemon's domain core: one board's jobs, models and device work, with no transport
(docs/daemon.md). `docs/daemon.md` draws who owns what.

- `device_core.DeviceCore`: the facade the servicer calls; builds views (`observe/views.py`) from snapshots.
- `engine.Engine`: owns every client job (`job_table`), model generation (`generations`), the
  `scheduler.Scheduler`, the `executor.Executor` and the board's reset controller, behind one lock;
  runs the engine and completion threads. Nothing outside it touches its state; `snapshot()` gives
  frozen views (`observe/snapshot.py`, built by `observe/snapshot_parts.py`). Its settings and answers:
  `engine_types`.
- `bookkeeping.Bookkeeper`: the engine's job and lane bookkeeping under its lock: queues jobs, moves
  them out of finished device jobs, ends them (parking or freeing lanes, `lane_closes` for the
  device), expires them (`expiry`), fails them at a halt.
- `reset_controller.ResetController`: every reset and halt of the board (reset state IDLE ->
  AUTOMATIC_CCU / OPERATOR_CCU / OPERATOR_CONFIGURATION -> SETTLING -> IDLE; halt NONE /
  AWAITING_OPERATOR / LOST), the reset budget, gate, tally and audit trail (`reset_budget`,
  `reset_audit`), under the engine lock; reaches the engine through `reset_host.ResetHost`.
  `operator_reset` runs an operator's Reset through its steps.
- `scheduler.Scheduler`: waiting / ready / recovering jobs and continuous batching; assigns and frees
  KV lanes (`kv.KVManager`, one per generation) and queues admission (`admission.AdmissionQueue`).
- `executor.Executor`: device jobs: reserves the planned rows' KV, fills a `jobs.JobContext` from the
  generation's `jobs.JobPool`, submits (outside the engine lock), commits or loses the rows.
- `completion`: what a finished device job means, decided without changing anything (`settle`).
- `models.ModelManager`: load, warm, publish, drain and unload generations through the engine.
- `observer`, `observer_records`: telemetry events and how the engine builds them; `heartbeat`: the
  engine thread's liveness listeners.

Data flow: Submit -> engine queues the job -> scheduler plans a device job and hands it lanes ->
executor prepares (lock) and submits (no lock) -> completion thread waits, samples, settles ->
engine applies (tokens streamed, KV committed or lost, lanes freed) -> buffers back to the pool.
A hung job or a lost device goes to the reset controller, which holds launches, resets the device
(no lock) and marks what the reset hit (lock).
"""
