"""Profiling helpers: synchronized wall-clock timing and peak memory (`timing`), torch.profiler traces (`overlap`)."""
