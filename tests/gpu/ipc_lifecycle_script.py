"""Two ranks on the GPU(s), the copy-engine transport under test (TELEFUSER_TEST_GPU_TRANSPORT, default ce-ipc):

    torchrun --standalone --nproc-per-node=2 tests/gpu/ipc_lifecycle_script.py normal|missing-peer|backlog|dead-peer-replay

normal: a clean run that must exit without CUDA IPC warnings. missing-peer: the last rank never submits its K, so
the other rank's watchdog must end it with a clear message after the 3 s timeout. backlog: both ranks queue seconds of
GPU work ahead of a group, longer than the timeout; the watchdog's clock starts only when the copy stream reaches the
handshake, so nothing fires. dead-peer-replay: both ranks capture two groups in a CUDA graph and replay it; then the
last rank exits and the other replays once more: its watchdog must end it within the timeout, naming the phase.
"""

import os
import sys
import time

import torch
import torch.distributed as dist

from telefuser.distributed.ulysses import UlyssesCommunicator
from telefuser.distributed.ulysses.copy_engine import CopyEngineOptions

TRANSPORT = os.environ.get("TELEFUSER_TEST_GPU_TRANSPORT", "ce-ipc")


def main(mode: str) -> None:
    per_rank = os.environ.get("TELEFUSER_TEST_GPU_PER_RANK") == "1"
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]) if per_rank else 0)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    timeout_s = 2.0 if mode == "backlog" else 3.0
    comm = UlyssesCommunicator(transport=TRANSPORT, options=CopyEngineOptions(timeout_s=timeout_s))
    x = torch.randn(1, 64, 4 * world, 64, device="cuda", dtype=torch.bfloat16) + rank
    for _ in range(3):  # warm: signatures agreed, targets mapped
        comm.scatter_heads(x, tag="v", barrier=False)
        comm.scatter_heads(x, tag="k").wait()
    torch.cuda.synchronize()
    assert comm.transport == TRANSPORT, (comm.transport, comm.fallback_reasons)
    if mode == "missing-peer":
        comm.scatter_heads(x, tag="v", barrier=False)
        if rank == world - 1:
            time.sleep(30)  # "raised before submitting K": never completes the group
            return
        comm.scatter_heads(x, tag="k").wait()
        torch.cuda.synchronize()  # blocks; the watchdog ends the process after 3 s
        print("unexpected: the handshake completed", flush=True)
        return
    if mode == "dead-peer-replay":
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(2):
                comm.scatter_heads(x, tag="v", barrier=False)
                comm.scatter_heads(x, tag="k").wait()
        for _ in range(5):
            graph.replay()
        torch.cuda.synchronize()
        dist.barrier()
        if rank == world - 1:
            print(f"rank {rank} exits without replaying", flush=True)
            os._exit(0)
        graph.replay()  # the peer is gone: the copy stream blocks in the replay's first open phase
        torch.cuda.synchronize()  # blocks; the watchdog ends the process after 3 s
        print("unexpected: the replay completed", flush=True)
        return
    if mode == "backlog":
        t0 = time.monotonic()
        torch.cuda._sleep(6_000_000_000)  # about 3 s of GPU time at H200 clocks: 1.5 timeouts before the handshake
        comm.scatter_heads(x, tag="v", barrier=False)
        out = comm.scatter_heads(x + 1, tag="k").wait()
        torch.cuda.synchronize()
        print(f"backlog rank {rank}: {time.monotonic() - t0:.1f} s, {out.shape}", flush=True)
    comm.close()
    dist.barrier()
    dist.destroy_process_group()
    print(f"ok rank {rank}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
