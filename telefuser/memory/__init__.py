"""Where weights live and whether a request fits: the memory plan (`plan`), the device budget (`budget`), host copies
and layer streaming (`host`, `streaming`), the CUDA allocator's settings (`allocator`) and `telefuser plan`."""
