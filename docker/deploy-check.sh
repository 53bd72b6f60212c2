#!/usr/bin/env bash
# make deploy-check: the multi-replica deployment (docker/compose.yaml) from the project's images, with the fake
# models, on this host's loopback, and the cross-replica checks against it (tools/validation/service_checks.py):
#   - a job created on video replica a is polled and downloaded on replica b (one PostgreSQL queue, one S3 store);
#   - a job created, polled and downloaded through the video proxy (HAProxy, docker/haproxy/serve.cfg);
#   - a stream session created through the stream proxy, its SSE stream read through the URL the reply names
#     (/r/<owner>/...), and a 421 naming the owner from the other replica's prefix (docker/haproxy/serve-stream.cfg).
# Then it brings the deployment down. Images it lacks are built first (the runtime image: ~7 min on 2 cores; reused
# when an earlier `KEEP=1 make images-check` left it). On demand, never in CI.
#
#   KEEP=1       keep the images afterwards; default: podman system reset of this check's store
#   COMPOSE      the compose command (default: PyPI's podman-compose 1.6.0, installed into $PODMAN_STATE: Debian's
#                1.0.3 refuses network_mode: host, and `podman compose` needs podman >= 4.7)
#   The ports are compose.yaml's variables; the check stops if one is taken.
set -euo pipefail
source "$(dirname "$0")/podman-lib.sh"
usage_if_asked "$@"

PROJECT=telefuser-check
export TAG=check BIND=127.0.0.1
export PG_PORT=${PG_PORT:-15432} S3_PORT=${S3_PORT:-19000}
export VIDEO_PROXY_PORT=${VIDEO_PROXY_PORT:-18000}
export VIDEO_A_PORT=${VIDEO_A_PORT:-18001} VIDEO_B_PORT=${VIDEO_B_PORT:-18002}
export STREAM_PROXY_PORT=${STREAM_PROXY_PORT:-18088} STREAM_A_PORT=${STREAM_A_PORT:-18089}
export STREAM_B_PORT=${STREAM_B_PORT:-18090} STREAM_STATS_PORT=${STREAM_STATS_PORT:-18404}
export PUBLIC_STREAM_URL=http://$BIND:$STREAM_PROXY_PORT
PGPASSWORD=$(python3 -c 'import secrets; print(secrets.token_hex(16))')
export PGPASSWORD
UP=0

compose() { nice -n 10 $COMPOSE -f "$REPO/docker/compose.yaml" -p "$PROJECT" "$@"; }

finish() {
    local rc=$?
    if ((UP)); then
        ((rc == 0)) || compose logs --tail 30 2>&1 | tail -150 >&2
        log "bringing the deployment down"
        compose down --timeout 10 >/dev/null 2>&1 || true
    fi
    podman_cleanup
    ((rc == 0)) && log "deploy-check passed in $((SECONDS / 60)) min $((SECONDS % 60)) s" ||
        log "deploy-check FAILED (exit $rc) after $((SECONDS / 60)) min $((SECONDS % 60)) s"
}
trap finish EXIT

compose_tool() {
    if [[ -z ${COMPOSE:-} ]]; then
        local venv=$PODMAN_STATE/compose-venv
        if [[ ! -x $venv/bin/podman-compose ]]; then
            log "installing podman-compose 1.6.0 from PyPI into $venv"
            python3 -m venv "$venv" && "$venv/bin/pip" install -q "podman-compose==1.6.0" ||
                die "could not install podman-compose into $venv"
        fi
        COMPOSE=$venv/bin/podman-compose
    fi
}

ports_free() {
    local port
    for port in "$PG_PORT" "$S3_PORT" "$VIDEO_PROXY_PORT" "$VIDEO_A_PORT" "$VIDEO_B_PORT" "$STREAM_PROXY_PORT" \
        "$STREAM_A_PORT" "$STREAM_B_PORT" "$STREAM_STATS_PORT"; do
        python3 -c "import socket; socket.create_server(('$BIND', $port)).close()" 2>/dev/null ||
            die "port $BIND:$port is in use; set the compose.yaml variable that names it (see docker/compose.yaml)"
    done
}

podman_setup
compose_tool
ports_free
base_image
runtime_image
for target in postgres haproxy s3; do
    have_image "localhost/telefuser-$target:$TAG" ||
        build_image "localhost/telefuser-$target:$TAG" docker/Dockerfile.services --target "$target"
done

step=$SECONDS
UP=1
log "compose up: PostgreSQL, S3 (moto), video replicas a and b + HAProxy, stream replicas a and b + HAProxy"
compose up -d >"$PODMAN_STATE/compose-up.log" 2>&1 ||
    { cat "$PODMAN_STATE/compose-up.log" >&2; die "compose up failed"; }
for port in "$VIDEO_A_PORT" "$VIDEO_B_PORT" "$VIDEO_PROXY_PORT" "$STREAM_A_PORT" "$STREAM_B_PORT" \
    "$STREAM_PROXY_PORT"; do
    wait_http "http://$BIND:$port/v1/service/health" 180 || die "nothing answers on $BIND:$port/v1/service/health"
done
# The stream proxy places new sessions only on replicas its health check has seen with a free slot: wait until its
# stats show both UP in the backend that places them.
python3 - "http://$BIND:$STREAM_STATS_PORT/stats;csv" <<'PY' || die "the stream proxy never saw both replicas UP"
import csv, io, sys, time, urllib.request
for _ in range(60):
    try:
        text = urllib.request.urlopen(sys.argv[1], timeout=2).read().decode().lstrip("# ")
    except OSError:
        text = ""
    rows = csv.DictReader(io.StringIO(text))
    if {"a", "b"} <= {r["svname"] for r in rows if r["pxname"] == "stream_new" and r["status"] == "UP"}:
        sys.exit(0)
    time.sleep(0.5)
sys.exit(f"{sys.argv[1]} says: {text[-500:]}")
PY
log "every service answers, $((SECONDS - step)) s after compose up"

checks="env PYTHONPATH=$REPO python3 -m tools.validation.service_checks"
$checks video --create "http://$BIND:$VIDEO_A_PORT" --poll "http://$BIND:$VIDEO_B_PORT"
$checks video --create "http://$BIND:$VIDEO_PROXY_PORT"
$checks stream --url "http://$BIND:$STREAM_PROXY_PORT" --replicas a,b
log "cross-replica checks passed"
