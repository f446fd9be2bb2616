#!/usr/bin/env bash
# Build the images the Docker tests use, without any registry (none is reachable in CI):
#   raygen-test/busybox  busybox-static rootfs, `docker import` (~0.2 s, 2 MB)
#   raygen-test/python   Debian bookworm minbase + python3 via debootstrap (~60 s, ~260 MB)
#   raygen-test/mcp      bookworm minbase + python3 + git, with the MCP servers of the tests (mcp-server-time,
#                        mcp-server-git, the mcp SDK) pip-installed from wheels downloaded on the host
#                        (PyPI through pip; the container that installs them has no network) (~90 s)
# Needs DOCKER_HOST (eval "$(.ci/docker-setup.sh WORKDIR)" first). Images that already exist are skipped;
# the debootstrap tarball is cached in build/ at the repo root (git-ignored) so a fresh engine
# re-imports it in seconds. The first build downloads from the Debian mirror: run it before entering a
# loopback-only network namespace (later runs, served from the cache, work inside one).
set -euo pipefail

log() { echo "build-test-images: $*" >&2; }
: "${DOCKER_HOST:?set DOCKER_HOST first: eval \"\$(.ci/docker-setup.sh WORKDIR)\"}"

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache_dir="$repo_root/build/test-images"
mkdir -p "$cache_dir"

have_image() { docker image inspect "$1" >/dev/null 2>&1; }

build_busybox() {
    local image=raygen-test/busybox
    if have_image "$image"; then log "$image exists"; return; fi
    local busybox_bin; busybox_bin="$(command -v busybox)"
    local rootfs; rootfs="$(mktemp -d)"
    mkdir -p "$rootfs"/{bin,etc,tmp,root,proc,sys,dev,work}
    chmod 1777 "$rootfs/tmp"
    cp "$busybox_bin" "$rootfs/bin/busybox"
    # One symlink per applet busybox was built with, so `sh -c` sees the usual tools (timeout, kill, ...).
    local applet
    for applet in $("$rootfs/bin/busybox" --list); do
        [[ "$applet" == busybox ]] || ln -sf busybox "$rootfs/bin/$applet"
    done
    printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' >"$rootfs/etc/passwd"
    printf 'root:x:0:\nnogroup:x:65534:\n' >"$rootfs/etc/group"
    tar -C "$rootfs" -c . | docker import -c 'ENV PATH=/bin' -c 'CMD ["/bin/sh"]' - "$image" >/dev/null
    rm -rf "$rootfs"
    log "built $image"
}

build_python() {
    local image=raygen-test/python
    if have_image "$image"; then log "$image exists"; return; fi
    local tarball="$cache_dir/bookworm-minbase-python3.tar"
    if [[ ! -s "$tarball" ]]; then
        local mirror
        mirror="$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)"
        mirror="${mirror:-http://deb.debian.org/debian}"
        local rootfs="$cache_dir/rootfs.tmp"
        rm -rf "$rootfs"
        log "debootstrap bookworm minbase + python3 from $mirror (~60 s)"
        debootstrap --variant=minbase --include=python3 bookworm "$rootfs" "$mirror" >&2
        rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
        # Write to a temporary name first so an interrupted run never leaves a truncated cache.
        tar -C "$rootfs" -cf "$tarball.tmp" .
        mv "$tarball.tmp" "$tarball"
        rm -rf "$rootfs"
    fi
    docker import -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        -c 'CMD ["/bin/bash"]' "$tarball" "$image" >/dev/null
    log "built $image"
}

debootstrap_tarball() {  # $1: tarball path, $2: packages (comma-separated)
    local tarball="$1" packages="$2"
    [[ -s "$tarball" ]] && return
    local mirror
    mirror="$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)"
    mirror="${mirror:-http://deb.debian.org/debian}"
    local rootfs="$tarball.rootfs.tmp"
    rm -rf "$rootfs"
    log "debootstrap bookworm minbase + $packages from $mirror"
    debootstrap --variant=minbase --include="$packages" bookworm "$rootfs" "$mirror" >&2
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    tar -C "$rootfs" -cf "$tarball.tmp" .
    mv "$tarball.tmp" "$tarball"
    rm -rf "$rootfs"
}

build_mcp() {
    local image=raygen-test/mcp
    if have_image "$image"; then log "$image exists"; return; fi
    local tarball="$cache_dir/bookworm-minbase-python3-git.tar" wheels="$cache_dir/mcp-wheels"
    debootstrap_tarball "$tarball" python3,git,ca-certificates
    if [[ ! -s "$wheels/.complete" ]]; then
        local pip="${PIP:-$repo_root/.venv/bin/pip}"
        [[ -x "$pip" ]] || pip="python3 -m pip"
        rm -rf "$wheels"
        # bookworm's python3 is 3.11: cp311 manylinux wheels; pip's own wheel installs the rest.
        $pip download --quiet --only-binary=:all: --python-version 3.11 --platform manylinux2014_x86_64 \
            --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 --dest "$wheels" \
            pip mcp mcp-server-time mcp-server-git >&2
        date >"$wheels/.complete"
    fi
    docker import "$tarball" raygen-test/mcp-base >/dev/null
    local cid
    cid="$(docker create --network none -v "$wheels":/wheels:ro raygen-test/mcp-base sh -c \
        'python3 "$(ls /wheels/pip-*.whl)/pip" install --quiet --no-index --find-links /wheels --break-system-packages \
         --root-user-action ignore mcp mcp-server-time mcp-server-git')"
    if ! docker start -a "$cid" >&2; then
        docker rm -f "$cid" >/dev/null; docker rmi raygen-test/mcp-base >/dev/null
        log "installing the MCP servers into $image failed"; return 1
    fi
    docker commit -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        -c 'CMD ["/bin/bash"]' "$cid" "$image" >/dev/null
    docker rm "$cid" >/dev/null
    docker rmi raygen-test/mcp-base >/dev/null
    log "built $image"
}

build_busybox
build_python
build_mcp
