"""`calctl bench --workload structured|tools`: schema'd answers and enforced tool calls through a
gateway's chat API, timed like any run and each answer checked (docs/benchmarking.md)."""
