"""One simulated rank of test_two_process_copy_and_handshake (run as a script, not collected).

Each rank owns one buffer: [flag array (world x bits) | recv[2][world][N] int32]. Handles are
exchanged through files in --dir. Per round k (epoch = epoch_base + k) every rank copies a
row into each peer's recv[k % 2][rank] with copy_2d, runs stream_handshake, then snapshots
its own recv[k % 2] on the same stream. Double buffering by round parity makes that safe: a
peer overwrites recv[k % 2] again only in round k + 2, after this rank's round-(k+1) publish,
which the stream orders after the snapshot.
"""

import argparse
import os
import sys
import time

import torch

FLAG_BYTES = 256
N = 1 << 14  # int32 elements per row


def _wait_for(path, timeout_s=120.0):
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {path}")
        time.sleep(0.01)


def _publish(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--rounds", type=int, default=32)
    ap.add_argument("--bits", type=int, default=64)
    ap.add_argument("--epoch-base", type=int, default=0)
    args = ap.parse_args()
    r, world, bits = args.rank, args.world, args.bits

    import tf_kernel

    torch.cuda.set_device(0)
    dev = torch.device("cuda", 0)
    fdtype = torch.int32 if bits == 32 else torch.int64
    mask = (1 << bits) - 1
    buf_bytes = FLAG_BYTES + 2 * world * N * 4
    buf = torch.zeros(buf_bytes, dtype=torch.uint8, device=dev)
    flags = buf[:FLAG_BYTES].view(fdtype)[:world]
    recv = buf[FLAG_BYTES:].view(torch.int32).view(2, world, N)
    start = args.epoch_base & mask  # flags hold the "previous" epoch
    flags.fill_(start - (1 << bits) if start >= (1 << (bits - 1)) else start)
    torch.cuda.synchronize()

    handle = tf_kernel.ipc_get_handle(buf)
    _publish(os.path.join(args.dir, f"handle.{r}"), bytes(handle.tolist()).hex())

    peer_ptr = [0] * world
    for p in range(world):
        if p == r:
            continue
        path = os.path.join(args.dir, f"handle.{p}")
        _wait_for(path)
        with open(path) as f:
            h = torch.tensor(list(bytes.fromhex(f.read())), dtype=torch.uint8)
        peer_ptr[p] = tf_kernel.ipc_open_handle(h)

    stream = torch.cuda.Stream()
    send = torch.empty(world, N, dtype=torch.int32, device=dev)
    peer_ids = torch.arange(world, dtype=torch.int32, device=dev).view(world, 1)
    snapshots = []
    row_bytes = N * 4
    with torch.cuda.stream(stream):
        for k in range(1, args.rounds + 1):
            epoch = args.epoch_base + k
            slot = k % 2
            if r == 0 and k % 8 == 0 and hasattr(torch.cuda, "_sleep"):
                torch.cuda._sleep(2_000_000)  # ~1 ms of GPU spin: rank 0 falls behind
            send.copy_((k * 1000 + r * 10 + peer_ids).expand(world, N))
            for p in range(world):
                if p == r:
                    continue
                tf_kernel.copy_2d(
                    send[p],
                    peer_ptr[p],
                    dst_capacity_bytes=buf_bytes,
                    dst_offset_bytes=FLAG_BYTES + (slot * world + r) * row_bytes,
                    width_bytes=row_bytes,
                    height=1,
                    src_pitch_bytes=row_bytes,
                    dst_pitch_bytes=row_bytes,
                    stream=stream,
                )
            tf_kernel.stream_handshake(peer_ptr, flags.data_ptr(), rank=r, epoch=epoch, bits=bits, stream=stream)
            snapshots.append(recv[slot].clone())
    stream.synchronize()

    errors = []
    for k, snap in enumerate(snapshots, start=1):
        for q in range(world):
            if q == r:
                continue
            want = k * 1000 + q * 10 + r
            got = snap[q]
            if not bool((got == want).all()):
                errors.append(f"round {k} from peer {q}: expected {want}, got {got[:4].tolist()}...")
    final = [x & mask for x in flags.tolist()]
    for q in range(world):
        if q != r and final[q] != (args.epoch_base + args.rounds) & mask:
            errors.append(f"flag slot {q} = {final[q]}, expected {(args.epoch_base + args.rounds) & mask}")

    # Host barrier before unmapping/freeing: every rank is done with every buffer.
    _publish(os.path.join(args.dir, f"done.{r}"), "1")
    for p in range(world):
        _wait_for(os.path.join(args.dir, f"done.{p}"))
    for p in range(world):
        if p != r:
            tf_kernel.ipc_close_handle(peer_ptr[p])
    _publish(os.path.join(args.dir, f"closed.{r}"), "1")
    for p in range(world):
        _wait_for(os.path.join(args.dir, f"closed.{p}"))

    if errors:
        print(f"RANK {r} FAILED:\n" + "\n".join(errors[:20]))
        sys.exit(1)
    print(f"RANK {r} OK ({args.rounds} rounds, {bits}-bit, epochs {args.epoch_base + 1}..{args.epoch_base + args.rounds})")


if __name__ == "__main__":
    main()
