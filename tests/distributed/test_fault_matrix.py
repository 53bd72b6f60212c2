"""The fault matrix's CPU columns (portable over gloo, host-shm): every fault confined to one rank ends the promised
way on every rank, within its wall-time bound. The GPU columns run with `tools/validation/ulysses_fault_matrix.py`."""

from __future__ import annotations

from tools.harness.fault_matrix import format_table, run_matrix

TIMEOUT_S = 2.0
BOUNDS = {"fast": 6.0, "timeout": TIMEOUT_S + 6.0}  # from the fault to the last rank's end, on a loaded 2-core host


def test_fault_matrix_cpu_columns():
    cells = run_matrix("cpu", TIMEOUT_S, BOUNDS)
    table = format_table(cells, "cpu", TIMEOUT_S)
    print(table)
    assert len(cells) == 20
    assert all(c.holds for c in cells), table
