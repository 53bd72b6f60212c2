"""Two ranks on one GPU: a normal run that must exit cleanly, or a run whose last rank skips its K submission.

    torchrun --standalone --nproc-per-node=2 tests/gpu/ipc_lifecycle_script.py normal|missing-peer
"""

import sys
import time

import torch
import torch.distributed as dist

from telefuser.distributed.ulysses import UlyssesCommunicator
from telefuser.distributed.ulysses.copy_engine import CopyEngineOptions


def main(mode: str) -> None:
    torch.cuda.set_device(0)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    comm = UlyssesCommunicator(transport="ce-ipc", options=CopyEngineOptions(timeout_s=3.0))
    x = torch.randn(1, 64, 4 * world, 64, device="cuda", dtype=torch.bfloat16) + rank
    for _ in range(3):  # warm: signatures agreed, targets mapped
        comm.scatter_heads(x, tag="v", barrier=False)
        comm.scatter_heads(x, tag="k").wait()
    torch.cuda.synchronize()
    assert comm.backend_name == "ce-ipc", comm.backend_name
    if mode == "missing-peer":
        comm.scatter_heads(x, tag="v", barrier=False)
        if rank == world - 1:
            time.sleep(30)  # "raised before submitting K": never completes the group
            return
        comm.scatter_heads(x, tag="k").wait()
        torch.cuda.synchronize()  # blocks; the watchdog ends the process after 3 s
        print("unexpected: the handshake completed", flush=True)
        return
    comm.close()
    dist.barrier()
    dist.destroy_process_group()
    print(f"ok rank {rank}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
