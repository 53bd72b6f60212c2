#!/usr/bin/env bash
# make images-check: build both images with podman on a machine like the project's (no Docker engine, no registry)
# and smoke-test them. About 7 minutes and up to ~24 GB of disk at its peak on 2 cores; on demand, never in CI.
#
#   dev image      `make build-sm90` and tf-kernel's CPU tests inside it
#   runtime image  `telefuser info` (tf-kernel built for sm_90a, every op registered); `telefuser serve --fake` and
#                  `serve-stream --fake` in containers answer their health routes and one request each, from the host
#                  over loopback (tools/validation/service_checks.py)
#
# Both build FROM a Debian bookworm root made here (docker/podman-lib.sh), so nvcc comes from PyPI. Variables:
#   KEEP=1                      keep the images (and the store) afterwards; default: podman system reset
#   BASE_IMAGE                  another base, e.g. nvidia/cuda:13.0.0-devel-ubuntu24.04 where a registry is reachable
#   RUNTIME_TORCH_VERSION, RUNTIME_TORCH_INDEX_URL   see docker/podman-lib.sh
#   DEV_TORCH_INDEX_URL         default PyPI: download.pytorch.org does not resolve here, and the CPU wheel comes from
#                               the host's wheel directory (the dev build fails if it got a CUDA build instead)
set -euo pipefail
source "$(dirname "$0")/podman-lib.sh"
usage_if_asked "$@"

DEV_TORCH_INDEX_URL=${DEV_TORCH_INDEX_URL:-https://pypi.org/simple}
DEV=localhost/telefuser-dev:check
RUNTIME=$RUNTIME_IMAGE
CONTAINERS=()

finish() {
    local rc=$?
    ((${#CONTAINERS[@]})) && { podman rm --force --time 5 "${CONTAINERS[@]}" >/dev/null 2>&1 || true; }
    podman_cleanup
    ((rc == 0)) && log "images-check passed in $((SECONDS / 60)) min $((SECONDS % 60)) s" ||
        log "images-check FAILED (exit $rc) after $((SECONDS / 60)) min $((SECONDS % 60)) s"
}
trap finish EXIT

# A service in the runtime image on the host's loopback; waits until its health route answers.
start_service() {  # NAME PORT telefuser-args...
    local name=$1 port=$2
    shift 2
    nice -n 10 podman run --detach --name "$name" --network host "$RUNTIME" "$@" --host 127.0.0.1 --port "$port" \
        >/dev/null
    CONTAINERS+=("$name")
    wait_http "http://127.0.0.1:$port/v1/service/health" && return 0
    podman logs "$name" 2>&1 | tail -20 >&2
    die "$name did not answer on 127.0.0.1:$port"
}

podman_setup
base_image

step=$SECONDS
build_image "$DEV" docker/Dockerfile.dev --build-arg "TORCH_INDEX_URL=$DEV_TORCH_INDEX_URL"
log "dev image built in $((SECONDS - step)) s"
step=$SECONDS
nice -n 10 podman run --rm --network host "$DEV" bash -c \
    'make build-sm90 PYTHON=.venv/bin/python && make -C tf-kernel test-cpu PYTHON=$PWD/.venv/bin/python PYTEST_ARGS=-q'
log "dev image: make build-sm90 and tf-kernel's CPU tests passed in $((SECONDS - step)) s"
# Its 3 GB need not sit beside the runtime build's disk peak (docker/README.md: Results).
[[ ${KEEP:-0} == 1 ]] || podman rmi "$DEV" >/dev/null

runtime_image
info=$(podman run --rm --network host "$RUNTIME" info)
python3 -c '
import json, sys
info = json.loads(sys.argv[1])
kernel, build = info["tf_kernel"], info["tf_kernel"]["build"]
assert kernel["all_ops_registered"], kernel["ops"]
assert "sm_90a" in build["cuda_archs"], build
torch, cuda, archs, nvcc = info["torch"], info["torch_cuda"], ", ".join(build["cuda_archs"]), build["nvcc_version"]
ops = len(kernel["ops"])
print(f"runtime image: telefuser info: torch {torch} (CUDA {cuda}), tf-kernel for {archs} (nvcc {nvcc}),",
      f"all {ops} ops registered")
' "$info" || die "telefuser info in the runtime image: $info"

video_port=$(free_port)
start_service telefuser-check-video "$video_port" serve --fake --artifacts /tmp/videos
stream_port=$(free_port)
start_service telefuser-check-stream "$stream_port" serve-stream --fake
PYTHONPATH="$REPO" python3 -m tools.validation.service_checks video --create "http://127.0.0.1:$video_port"
PYTHONPATH="$REPO" python3 -m tools.validation.service_checks stream --url "http://127.0.0.1:$stream_port"
log "podman store: $(du -shx "$PODMAN_STATE/storage" | cut -f1) at the end"
