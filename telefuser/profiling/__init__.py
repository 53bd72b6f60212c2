"""Profiling helpers: reading torch.profiler traces."""
