"""`calculet.common`: the floor below the daemon, the client, the gateway and ops (issue 32).

What every side uses and no side owns. It imports nothing from `calculet.daemon`, `calculet.client`,
`calculet.gateway` or `calculet.ops` (the import-linter contracts in pyproject.toml keep it so);
the generated `calculet.v1` messages are the only other calculet package it may read.

    errors.py           CalculetError, its ErrorKind and one class per kind: the typed domain errors
    error_codes.py      the one table between error kinds, gRPC status codes and the wire's ErrorKind
    lifecycle.py        Lifecycle: an Enum plus its transition table, the one way any state changes
    aliases.py          check_alias: the model alias rule of common.proto
    telemetry/          log lines, traces and the metrics registry base of both processes
    sd_notify.py        Notifier: systemd's sd_notify(3) protocol without libsystemd
    parent_death.py     die_with_parent: a child of `calctl up` goes when its parent does
    prefix.py           chained token-block hashes: the daemon advertises them, the gateway matches
    phase_clock.py      PhaseClock: seconds per switch phase, from either side's ModelState progress
    process_start.py    what an entry module sets before its imports: one OpenBLAS thread, no collector passes
"""
