"""Prints what CMakeLists.txt needs to know about the torch of the building Python.

Output is a CMake list (';'-separated): torch dir, torch.__version__, CXX11 ABI flag (0/1).
find_package(Torch) is deliberately not used: with a CUDA build of torch it pulls in
torch's own CUDA setup (architecture auto-detection, nvrtc, extra -gencode flags), which
would make the CPU-torch and CUDA-torch builds behave differently. The extension only needs
torch's headers, libc10 and libtorch_cpu.
"""

import os
import sys

import torch

print(
    ";".join(
        [
            os.path.dirname(os.path.abspath(torch.__file__)),
            torch.__version__,
            str(int(bool(torch._C._GLIBCXX_USE_CXX11_ABI))),
        ]
    ),
    end="",
)
sys.stdout.flush()
