"""The harness in reports/: benchmarks and plans, `twinfer diff` and the endpoint diff, the serving studies,
the memory check, and the HTML report."""
