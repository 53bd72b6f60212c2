"""Correctness and hardening checks that need more than the test suite (`python -m tools.validation.<name> --help`)."""
