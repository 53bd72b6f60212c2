"""AIPerf benchmarks of the services; `telefuser_aiperf` is also installed on its own into .venv-aiperf."""
