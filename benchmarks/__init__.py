"""The suite's speed, measured: ``python -m benchmarks`` writes ``reports/benchmark.json`` (benchmarks/README.md)."""
