"""twinfer's harness: differential comparisons, benchmarks, reports, and the `twinfer` command."""
