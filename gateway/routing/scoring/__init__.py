"""The TTFT router's scorers (docs/gateway.md; the shape of llm-d's endpoint picker).

Each scorer is a pure function of (the prepared request, one candidate board's view) -> estimated
milliseconds; a board's estimated time to first token is their sum (`estimate.estimate_ms`), and
the router takes the lowest. Inputs are plain data (`inputs.RouteRequest`, `inputs.BoardView`),
built by the router from the boards' load reports, this gateway's own placements and the package's
declared costs: no I/O, clock or randomness in this package, so every scorer is tested on numbers.

    est_ttft(b) = work_ahead(b) + own_prefill(b) + lane_wait(b)   (+ one decode step, equal for all)

One file per scorer: `work_ahead.py`, `own_prefill.py`, `lane_wait.py`; `prefix.py` says how many
of the prompt's tokens a board already holds.
"""
