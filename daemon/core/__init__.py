"""The daemon's domain core: one board's jobs, models and device work, with no transport
(DESIGN.md section 3). `docs/daemon.md` draws who owns what.

- `device_core.DeviceCore`: the facade the servicer calls; builds views (`views.py`) from snapshots.
- `engine.Engine`: owns every client job (`job_table`), model generation (`generations`), the
  `scheduler.Scheduler` and the `executor.Executor`, behind one lock; runs the engine and completion
  threads. Nothing outside it touches its state; `snapshot()` gives frozen views (`snapshot.py`).
- `scheduler.Scheduler`: waiting / ready / recovering jobs and continuous batching; assigns and frees
  KV lanes (`kv.KVManager`, one per generation) and queues admission (`admission.AdmissionQueue`).
- `executor.Executor`: device jobs: reserves the planned rows' KV, fills a `jobs.JobContext` from the
  generation's `jobs.JobPool`, submits (outside the engine lock), commits or loses the rows.
- `completion`: what a finished device job means, decided without changing anything (`settle`).
- `models.ModelManager`: load, warm, publish, drain and unload generations through the engine.

Data flow: Submit -> engine queues the job -> scheduler plans a device job and hands it lanes ->
executor prepares (lock) and submits (no lock) -> completion thread waits, samples, settles ->
engine applies (tokens streamed, KV committed or lost, lanes freed) -> buffers back to the pool.
"""
