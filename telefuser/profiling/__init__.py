"""Profiling helpers: synchronized timing and peak memory (`timing`), trace overlap (`overlap`), FLOP rates."""
