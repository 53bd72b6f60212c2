"""The engine turns the allocator's expandable segments on (memory/allocator.py), whose memory legacy CUDA IPC cannot
export; the copy engine's CUDA IPC buffers are allocated inside `ipc_shareable_segments`. Checked in a fresh process
started with the engine's setting: a buffer from inside the context exports a handle, one from outside does not (the
negative control: without the context the ce-ipc transport fails its setup)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.tf_kernel

SCRIPT = """
import json, torch
from telefuser.distributed.ulysses.selection import IPC_OPS, tf_kernel_ops
from telefuser.memory.allocator import ipc_shareable_segments

ops, missing = tf_kernel_ops(IPC_OPS)
assert ops is not None, missing
torch.ones(1 << 20, device="cuda")  # an expandable segment exists before the context

def exports(make):
    try:
        ops.ipc_get_handle(make())
        return "ok"
    except Exception as exc:
        return type(exc).__name__

# first: once a plain segment is cached, the allocator may hand its blocks out with expandable segments on too
outside = exports(lambda: torch.zeros(3 << 20, dtype=torch.bfloat16, device="cuda"))
with ipc_shareable_segments():
    inside = exports(lambda: torch.zeros(3 << 20, dtype=torch.bfloat16, device="cuda"))
    small = exports(lambda: torch.zeros(4096, dtype=torch.uint8, device="cuda"))  # a small-pool block
print(json.dumps({"inside": inside, "small": small, "outside": outside}))
"""


def test_copy_engine_buffers_export_under_the_engines_expandable_segments():
    env = {**os.environ, "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["inside"] == "ok" and result["small"] == "ok", result
    assert result["outside"] != "ok", result  # the control: expandable memory is refused by cudaIpcGetMemHandle
