"""What both services share: launch and the torchrun replay of model calls, the HTTP server, request bodies and
errors, API keys, request limits and the memory budget, and Prometheus text."""
