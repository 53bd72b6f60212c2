"""Benchmarks of the models, transports and services (`python -m tools.bench.<name> --help`)."""
