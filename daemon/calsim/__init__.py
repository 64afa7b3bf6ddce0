"""calsim: the embedded emulator of one Calculet board behind the device contract (docs/vendor-binding.md).

Data flow: `device.CalsimDriver.open` (entry point `calsim` of `calculet.devices`) parses
`options`, holds the board for this process (`device_lock`: one process per board, as a real
runtime) and opens a `device.CalsimDevice`. `configure` checks the package (`model_check`),
reserves per-chip memory (`memory`) and builds a `kernel.Kernel` that owns the model's KV lanes.
`submit` validates a job (`job_check`), consults the fault plan (`faults`) and hands it to the
`engine`: two engine banks (ping/pong) and one compute unit on a modelled device clock (`clock`,
durations from `timing`), executed by one worker thread that reads host inputs at H2D time,
computes (`compute` -> kernel) and writes bf16 logits at D2H time. Callers hold `handles`:
`CalsimModel` per configured package, `CalsimSubmission` per accepted job.
"""
