#!/usr/bin/env bash
# Install (if missing) and start a private Docker engine whose state lives under WORKDIR.
#
# Usage:  eval "$(.ci/docker-setup.sh /tmp/rg-docker)"     # sets DOCKER_HOST for this shell
#         .ci/docker-setup.sh --stop /tmp/rg-docker         # stop that engine
#
# Idempotent: a second call finds the engine answering on WORKDIR/docker.sock and only prints the export.
# The engine needs no network of its own (--bridge=none, no iptables), so it also runs inside a
# loopback-only network namespace (`unshare -n`); containers get network_mode=none anyway.
# Everything but the final `export` line goes to stderr so the caller can eval stdout.
set -euo pipefail

log() { echo "docker-setup: $*" >&2; }

stop=0
if [[ "${1:-}" == "--stop" ]]; then stop=1; shift; fi
workdir="${1:?usage: docker-setup.sh [--stop] WORKDIR}"
mkdir -p "$workdir"
workdir="$(cd "$workdir" && pwd)"
sock="$workdir/docker.sock"
pidfile="$workdir/dockerd.pid"

engine_pid() {
    [[ -s "$pidfile" ]] || return 1
    local pid; pid="$(cat "$pidfile")"
    kill -0 "$pid" 2>/dev/null || return 1
    # A pid file left by an engine of an earlier boot may name another process now (pids are reused).
    [[ "$(cat "/proc/$pid/comm" 2>/dev/null)" == dockerd ]] || return 1
    echo "$pid"
}

# The engine's own API answers /_ping with "OK" once it is ready; curl is not always installed,
# so ask with the docker CLI (installed with docker.io) which honours DOCKER_HOST.
engine_ready() { DOCKER_HOST="unix://$sock" docker version --format '{{.Server.Version}}' >/dev/null 2>&1; }

if (( stop )); then
    if pid="$(engine_pid)"; then
        kill "$pid"
        for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        log "stopped dockerd (pid $pid)"
    else
        log "no dockerd running for $workdir"
    fi
    exit 0
fi

if ! command -v dockerd >/dev/null 2>&1 || ! command -v docker >/dev/null 2>&1 \
    || ! command -v busybox >/dev/null 2>&1 || ! command -v debootstrap >/dev/null 2>&1; then
    log "installing docker.io, containerd, runc, busybox-static, debootstrap"
    export DEBIAN_FRONTEND=noninteractive
    packages=(docker.io containerd runc busybox-static debootstrap)
    # apt-get update only when the package lists are empty (fresh image) or stale (install fails).
    if ! apt-cache show docker.io >/dev/null 2>&1; then apt-get update -qq >&2; fi
    if ! apt-get install -y -qq --no-install-recommends "${packages[@]}" >&2; then
        apt-get update -qq >&2
        apt-get install -y -qq --no-install-recommends "${packages[@]}" >&2
    fi
fi

if engine_pid >/dev/null && engine_ready; then
    log "dockerd already running for $workdir"
else
    if pid="$(engine_pid)"; then
        log "dockerd pid $pid is alive but not answering; waiting for it"
    else
        rm -f "$pidfile" "$sock"
        log "starting dockerd (log: $workdir/dockerd.log)"
        # setsid + nohup: the engine must outlive this script and the caller's terminal.
        setsid nohup dockerd \
            --data-root="$workdir/docker-root" --exec-root="$workdir/docker-exec" \
            --pidfile="$pidfile" --host="unix://$sock" --storage-driver=overlay2 \
            --iptables=false --ip6tables=false --bridge=none \
            >"$workdir/dockerd.log" 2>&1 </dev/null &
    fi
    # Bounded wait: ~1 s is usual; give up after 60 s with the engine's log tail.
    for _ in $(seq 1 600); do
        engine_ready && break
        sleep 0.1
    done
    if ! engine_ready; then
        log "dockerd did not become ready within 60 s; last log lines:"
        tail -n 20 "$workdir/dockerd.log" >&2 || true
        exit 1
    fi
    log "dockerd ready"
fi

echo "export DOCKER_HOST=unix://$sock"
