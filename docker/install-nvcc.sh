#!/bin/sh
# Used by the Dockerfiles: nvcc for tf-kernel when the base image has none (a plain Debian or Ubuntu base). NVIDIA's
# CUDA compiler wheels from PyPI (cuda-toolkit[nvcc,...], about 100 MB) are laid out as /usr/local/cuda, where
# tf-kernel's Makefile looks. Debian's nvidia-cuda-toolkit (11.8) cannot build sm_90a, and nvidia-cuda-nvcc-cu13 is
# a deprecated stub. A throwaway venv's pip installs them with --target, so no environment's torch pin is touched.
#   install-nvcc.sh CUDA_TOOLKIT_VERSION    (13.x: those wheels install under nvidia/cu13)
set -eu
version=$1
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
    echo "nvcc from the base image: $(command -v nvcc || echo /usr/local/cuda/bin/nvcc)"
    exit 0
fi
case $version in
    13.*) ;;
    *) echo "error: CUDA_TOOLKIT_VERSION=$version: only 13.x wheels are laid out here" >&2; exit 1 ;;
esac
work=$(mktemp -d)
python3 -m venv "$work/venv"
"$work/venv/bin/pip" install --no-cache-dir --quiet --target "$work/wheels" \
    "cuda-toolkit[nvcc,crt,nvvm,cccl,cudart]==$version"
mv "$work/wheels/nvidia/cu13" "/usr/local/cuda-$version"
rm -rf "$work"
ln -s "cuda-$version" /usr/local/cuda
# The layout of a toolkit root that nvcc.profile (-I$TOP/targets/<arch>/include) and CMake's FindCUDAToolkit expect.
root=/usr/local/cuda-$version
ln -s lib "$root/lib64"
mkdir -p "$root/targets/$(uname -m)-linux"
ln -s ../../include "$root/targets/$(uname -m)-linux/include"
ln -s ../../lib "$root/targets/$(uname -m)-linux/lib"
# Wheels hold no symlinks: give each versioned library its unversioned name (libcudart.so), which the linker and
# FindCUDAToolkit look for.
for lib in "$root"/lib/lib*.so.*; do
    ln -sf "$(basename "$lib")" "${lib%%.so.*}.so"
done
/usr/local/cuda/bin/nvcc --version | tail -n 2
