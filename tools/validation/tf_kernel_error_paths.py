"""Each tf-kernel validation error, raised in its own subprocess so that a crash in one is reported, not fatal.

python -m tools.validation.tf_kernel_error_paths
"""

import subprocess
import sys

OP = "torch.ops.tf_kernel.copy_2d"
# copy_2d(src, src_off, src_pitch, src_bstride, dst_ptr, dst_cap, dst_off, dst_pitch, dst_bstride, width, height, batch, stream)
CASES = {
    "negative_height_cpu_src": f"{OP}(torch.zeros(8), 0, 4, 0, 4096, 32, 0, 4, 0, 4, -1, 1, 0)",
    "negative_height_cuda_src": f"{OP}(torch.zeros(8, device='cuda'), 0, 4, 0, 4096, 32, 0, 4, 0, 4, -1, 1, 0)",
    "src_out_of_bounds_cuda": f"{OP}(torch.zeros(8, device='cuda'), 0, 16, 0, 4096, 256, 0, 16, 0, 16, 4, 1, 0)",
    "cpu_tensor_device_check": f"{OP}(torch.zeros(8), 0, 4, 0, 4096, 32, 0, 4, 0, 4, 1, 1, 0)",
    "bad_bits": "torch.ops.tf_kernel.stream_write_value(0, 1, 0, 16)",
}

if __name__ == "__main__":
    failures = 0
    for name, stmt in CASES.items():
        code = f"import torch, tf_kernel\ntry:\n    {stmt}\nexcept RuntimeError as e:\n    print('RuntimeError:', str(e).splitlines()[0][:150])\nelse:\n    print('no error')"
        r = subprocess.run(
            [sys.executable, "-X", "faulthandler", "-c", code], capture_output=True, text=True, timeout=60
        )
        ok = r.returncode == 0 and "RuntimeError" in r.stdout
        failures += not ok
        print(
            f"{name:<26} rc={r.returncode:<4} {'ok ' if ok else 'BAD'} {r.stdout.strip()[:160]} {'' if ok else r.stderr.strip()[-300:]}"
        )
    sys.exit(1 if failures else 0)
