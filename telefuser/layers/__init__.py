"""Reusable transformer layers that know how to run under Ulysses sequence parallelism."""
