"""`calctl bench suite`: the benchmark matrix of docs/sources.md 001 §12 on local calsim fleets, related to
the timing model.

Data flow (docs/benchmarking.md, "bench suite"):

    matrix (configurations x workloads x concurrencies x targets; quick or full) -> packages (built
    once per decode batch) -> expand (lengths scaled to the packages' context) -> estimates (the
    timing-model limit of each run; the time scale of each fleet) -> runner (a LocalFleet per
    configuration; each run a `calctl bench` in-process, host CPU sampled around it) -> the suite
    document (JSON) -> markdown report and plots.

Modules: `matrix`, `prompts`, `packages`, `estimate`, `fleet`, `cpu`, `runner`, `report`, `plot`,
`markdown` (shared by the reports), `document`. The multi-turn comparison of issue 19 (`--multiturn`):
`multiturn_flags` -> `multiturn` (fleets, sizes) -> `multiturn_estimate` -> `multiturn_runner` (one
fleet, one `calctl bench --workload multiturn`) -> `multiturn_targets`, `multiturn_report`,
`multiturn_plot`; `multiturn_suite` runs it end to end.
"""
