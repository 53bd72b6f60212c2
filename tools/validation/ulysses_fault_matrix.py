"""Run the Ulysses fault matrix and print its table (rows: faults confined to one rank; columns: transports).

    python -m tools.validation.ulysses_fault_matrix --device cpu                  # portable (gloo), host-shm
    python -m tools.validation.ulysses_fault_matrix --device cuda --output t.md   # 2 processes sharing GPU 0: portable, ce-ipc

Each cell starts two fresh ranks, injects the fault on rank 1 and checks the outcome and its wall time
(tools/harness/fault_matrix.py has the cells and the rules). Exits 1 when any cell fails.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tools.harness.fault_matrix import ROWS, format_table, run_matrix


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--timeout-s", type=float, default=None, help="the communicator's timeout (default 2 cpu, 3 cuda)")
    p.add_argument("--rows", default=None, help=f"comma-separated subset of {[r.name for r in ROWS]}")
    p.add_argument("--output", default=None, help="also write the table (Markdown) here")
    args = p.parse_args()
    timeout_s = args.timeout_s or (2.0 if args.device == "cpu" else 3.0)
    bounds = {"fast": 6.0 if args.device == "cpu" else 10.0, "timeout": timeout_s + 6.0}
    cells = run_matrix(args.device, timeout_s, bounds, rows=args.rows.split(",") if args.rows else None)
    table = format_table(cells, args.device, timeout_s)
    print(table)
    if args.output:
        Path(args.output).write_text(table + "\n")
    return 0 if all(c.holds for c in cells) else 1


if __name__ == "__main__":
    sys.exit(main())
