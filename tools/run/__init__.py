"""One step runner for the device calls: named plans of steps, each with its own time limit and log.

    python -m tools.run --list                                   # every plan and its steps
    python -m tools.run --plan h200-models --steps setup_wheels,tf_kernel,minimax --out /tmp/h200

Plans are data (plans.py); running them is execute.py; the run's record (summary, tarball) is record.py.
"""
