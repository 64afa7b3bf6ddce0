"""The daemon's core bookkeeping, below the scheduler and executor (DESIGN.md section 3).

Plain classes, no gRPC and no device threads of their own:

- `kv.KVManager`: the KV lanes of one model generation as transactions
  (assign -> reserve -> commit | rollback; faults mark a lane unknown).
- `admission.AdmissionQueue`: requests waiting for capacity, by priority then arrival, with deadlines.
- `jobs.JobPool` / `jobs.JobContext`: the host buffers one device job may DMA, allocated and
  registered once per pool slot and handed out by pool key.

Data flow: the scheduler pops an admissible request from the `AdmissionQueue` (asking the
`KVManager` whether a lane is free), assigns it a lane, reserves the lane's next length, acquires
a `JobContext`, and the executor submits; on completion the executor commits or rolls back the
reservation and releases (or quarantines) the context.
"""
