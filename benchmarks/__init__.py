"""flowllm's benchmark suite: ``python -m benchmarks`` writes ``benchmarks/results.md`` (see run.py)."""
