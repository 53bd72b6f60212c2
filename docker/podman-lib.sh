# shellcheck shell=bash
# Helpers for docker/images-check.sh and docker/deploy-check.sh (sourced, not run): podman on a machine like the
# project's (Debian bookworm, root, no Docker engine, no image registry), in a store of its own so that cleaning up
# never touches another user's containers.
#
#   PODMAN_STATE  where the store, its configuration and the Debian root live (/var/tmp/telefuser-podman); kept with
#                 KEEP=1, removed otherwise
#   BASE_IMAGE    the base both images build FROM (default: a Debian bookworm root made here with debootstrap)
#   DEBIAN_MIRROR debootstrap's mirror (http://deb.debian.org/debian)
#   RUNTIME_TORCH_VERSION, RUNTIME_TORCH_INDEX_URL   the runtime image's torch: 2.14.1 from PyPI by default, whose Linux
#                 wheel is the CUDA 13 build and whose 7 GB of wheels lie on these machines (the Dockerfile's own
#                 default, 2.11.0 from PyTorch's cu130 index, is not reachable here)

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PODMAN_STATE=${PODMAN_STATE:-/var/tmp/telefuser-podman}
LOCAL_BASE=localhost/telefuser-base:bookworm
BASE_IMAGE=${BASE_IMAGE:-$LOCAL_BASE}
DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
RUNTIME_TORCH_VERSION=${RUNTIME_TORCH_VERSION:-2.14.1}
RUNTIME_TORCH_INDEX_URL=${RUNTIME_TORCH_INDEX_URL:-https://pypi.org/simple}
RUNTIME_IMAGE=localhost/telefuser:check
export CONTAINERS_CONF=$PODMAN_STATE/containers.conf CONTAINERS_STORAGE_CONF=$PODMAN_STATE/storage.conf

# -h/--help of a check script: its header comment.
usage_if_asked() {  # "$@" of the script
    [[ ${1:-} == -h || ${1:-} == --help ]] || return 0
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
    exit 0
}

log() { printf '== %s  %s\n' "$(date +%H:%M:%S)" "$*"; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

# Debian's podman, runc and debootstrap when missing. runc, not crun: crun rejects this sandbox's cgroup layout.
podman_setup() {
    local missing=()
    command -v podman >/dev/null || missing+=(podman)
    command -v runc >/dev/null || missing+=(runc)
    command -v debootstrap >/dev/null || missing+=(debootstrap)
    if ((${#missing[@]})); then
        log "installing Debian's ${missing[*]}"
        export DEBIAN_FRONTEND=noninteractive
        local install=(apt-get install -y -q --no-install-recommends "${missing[@]}")
        "${install[@]}" >/dev/null 2>&1 || { apt-get update -q >/dev/null && "${install[@]}" >/dev/null; } ||
            die "could not install ${missing[*]} with apt-get (run as root on Debian/Ubuntu, or install them yourself)"
    fi
    mkdir -p "$PODMAN_STATE"
    # podman's default nofile/nproc limits exceed what a process without CAP_SYS_RESOURCE may set: ask for the host's
    # open-file limit and at most 32768 processes (runc was refused nproc=65536 under a hard limit of 96363 here).
    # Every container joins the host's network: no bridge (CNI, netavark) works in this sandbox.
    local nofile nproc
    nofile=$(ulimit -Hn) nproc=$(ulimit -Hu)
    [[ $nproc == unlimited || $nproc -gt 32768 ]] && nproc=32768
    [[ $nofile == unlimited || $nofile -gt 1048576 ]] && nofile=1048576
    cat >"$CONTAINERS_CONF" <<EOF
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=$nproc:$nproc"]
netns = "host"
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF
    cat >"$CONTAINERS_STORAGE_CONF" <<EOF
[storage]
driver = "overlay"
graphroot = "$PODMAN_STATE/storage"
runroot = "$PODMAN_STATE/run"
EOF
    podman info >/dev/null || die "podman does not start here (podman info); see docker/README.md"
}

have_image() { podman image exists "$1"; }

# A Debian bookworm root with debootstrap, imported as $LOCAL_BASE: the stand-in for nvidia/cuda:*-devel where no
# registry can be reached. The root's tarball stays in $PODMAN_STATE while that is kept (KEEP=1): a later check
# skips debootstrap.
base_image() {
    [[ $BASE_IMAGE != "$LOCAL_BASE" ]] && return 0
    have_image "$LOCAL_BASE" && return 0
    local tarball=$PODMAN_STATE/debian-bookworm.tar
    if [[ ! -s $tarball ]]; then
        local root=$PODMAN_STATE/debootstrap
        rm -rf "$root"
        log "debootstrap: Debian bookworm (minbase) from $DEBIAN_MIRROR"
        nice -n 10 debootstrap --variant=minbase bookworm "$root" "$DEBIAN_MIRROR" \
            >"$PODMAN_STATE/debootstrap.log" 2>&1 || die "debootstrap failed; see $PODMAN_STATE/debootstrap.log"
        tar -C "$root" -cf "$tarball.partial" . && mv "$tarball.partial" "$tarball"
        rm -rf "$root"
    fi
    podman import --quiet "$tarball" "$LOCAL_BASE" >/dev/null || die "podman import of $tarball failed"
}

# podman build from the repository root (.dockerignore applies) with the host's network, its CA bundle and the local
# wheel directories its pip configuration names, all read-only: pip in the build trusts what the host trusts and takes
# wheels the host already has (the 7 GB of CUDA torch) instead of downloading them again.
#   build_image TAG DOCKERFILE [podman build options...]
build_image() {
    local tag=$1 dockerfile=$2
    shift 2
    local args=(--network host --pull=never --build-arg "BASE=$BASE_IMAGE")
    local ca=${HOST_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
    if [[ -s $ca ]]; then
        args+=(-v "$ca:/run/host-ca.crt:ro" --build-arg PIP_CERT=/run/host-ca.crt)
    fi
    local links index dir
    links=$(host_pip find-links "${PIP_FIND_LINKS:-}")
    index=$(host_pip extra-index-url "${PIP_EXTRA_INDEX_URL:-}")
    for dir in $links; do
        args+=(-v "${dir#file://}:${dir#file://}:ro")
    done
    for dir in $index; do  # a local index's pages link to files beside it (../../files/...): mount its parent
        dir=$(dirname "${dir#file://}")
        args+=(-v "$dir:$dir:ro")
    done
    [[ -n $links ]] && args+=(--build-arg "PIP_FIND_LINKS=$links")
    [[ -n $index ]] && args+=(--build-arg "PIP_EXTRA_INDEX_URL=$index")
    log "podman build $tag ($dockerfile)"
    nice -n 10 podman build "${args[@]}" "$@" -f "$REPO/$dockerfile" -t "$tag" "$REPO" ||
        die "podman build of $tag failed"
}

# The runtime image (docker/Dockerfile), unless this store has it already (an earlier check with KEEP=1).
runtime_image() {
    have_image "$RUNTIME_IMAGE" && { log "runtime image $RUNTIME_IMAGE: already built"; return 0; }
    local start=$SECONDS
    build_image "$RUNTIME_IMAGE" docker/Dockerfile \
        --build-arg "TORCH_VERSION=$RUNTIME_TORCH_VERSION" --build-arg "TORCH_INDEX_URL=$RUNTIME_TORCH_INDEX_URL" ||
        die "the runtime image did not build (docker/Dockerfile)"
    log "runtime image built in $((SECONDS - start)) s ($(podman image inspect --format '{{.Size}}' "$RUNTIME_IMAGE" |
        numfmt --to=si)B)"
}

# The local entries (existing directories, file:// URLs) of one host pip setting, from the environment or pip's config.
host_pip() {
    local value=$2 entry out=()
    [[ -z $value ]] && value=$(python3 -m pip config get "global.$1" 2>/dev/null || true)
    for entry in $value; do
        [[ -d ${entry#file://} ]] && out+=("$entry")
    done
    echo "${out[*]}"
}

# Waits until URL answers 200 (up to SECONDS, default 120); status 1 when it never does.
wait_http() {  # URL [SECONDS]
    local deadline=$((SECONDS + ${2:-120}))
    until python3 -c "import urllib.request as u; u.urlopen('$1', timeout=2)" 2>/dev/null; do
        ((SECONDS < deadline)) || return 1
        sleep 1
    done
}

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# Everything in this store (containers, images, build cache) goes, unless KEEP=1.
podman_cleanup() {
    if [[ ${KEEP:-0} == 1 ]]; then
        log "KEEP=1: images stay in $PODMAN_STATE (podman with CONTAINERS_CONF=$CONTAINERS_CONF" \
            "CONTAINERS_STORAGE_CONF=$CONTAINERS_STORAGE_CONF sees them)"
        return 0
    fi
    log "podman system reset ($PODMAN_STATE/storage), then $PODMAN_STATE goes"
    podman system reset --force >/dev/null 2>&1 || true
    # Only what these scripts made: PODMAN_STATE may name a folder that holds other things too.
    (cd "$PODMAN_STATE" && rm -rf storage run debootstrap debian-bookworm.tar debian-bookworm.tar.partial compose-venv \
        containers.conf storage.conf debootstrap.log compose-up.log)
    rmdir "$PODMAN_STATE" 2>/dev/null || true
}
