"""Benchmarks, validation runs and the step runner; run each from the repository root as `python -m tools.<path>`."""
