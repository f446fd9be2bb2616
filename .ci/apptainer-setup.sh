#!/usr/bin/env bash
# The "HPC node" fixture for the Singularity/Apptainer backend: Debian 12 has no apptainer package, so the
# real apptainer (Debian sid's 1.4) runs inside a long-running Docker container, and a wrapper script on
# the host forwards `apptainer ...` into it. ROOT is bind-mounted into the node at the same path, so paths
# under ROOT (session workdirs, SIF caches, images) mean the same thing on both sides.
#
# Usage:  eval "$(.ci/apptainer-setup.sh [ROOT])"   # default ROOT=/tmp/raygen-hpc; exports PATH and
#                                                     # RAYGEN_HPC_ROOT (the tests find ROOT/bin/apptainer)
#         .ci/apptainer-setup.sh --stop [ROOT]       # remove the node container
# Needs DOCKER_HOST (eval "$(.ci/docker-setup.sh WORKDIR)") and raygen-test/{busybox,python}
# (.ci/build-test-images.sh). Idempotent: with everything in place a rerun takes about a second.
#
# What it makes:
#   raygen-test/hpc-apptainer  Debian sid minbase + apptainer + squashfuse/fuse-overlayfs (debootstrap, ~2.5 min;
#                              the tarball is cached in build/test-images/, so a fresh engine re-imports it in ~10 s)
#   raygen-hpc-node-<hash>     the node: no network, /dev/fuse, seccomp/apparmor unconfined (user namespaces)
#   ROOT/bin/apptainer         the wrapper: `docker exec -i -u <caller's uid>` into the node, forwarding the
#                              caller's APPTAINER*/SINGULARITY* variables by name (values never on a command line)
#   ROOT/images/               busybox.tar (docker save), busybox-sandbox/ (apptainer build --sandbox),
#                              debian.sif (bookworm + python3, from docker-archive://; cached in build/test-images/)
#   ROOT/work, ROOT/cache      session workdirs and SIF caches for the tests
# apptainer runs as the caller's uid (root in CI), the same user as the backend on the host, as on a real HPC
# node; in this unprivileged container that is apptainer's user-namespace mode with FUSE mounts.
# The first build downloads from the Debian mirror: run it before entering a loopback-only namespace.
set -euo pipefail

log() { echo "apptainer-setup: $*" >&2; }

stop=0
if [[ "${1:-}" == "--stop" ]]; then stop=1; shift; fi
root="${1:-/tmp/raygen-hpc}"
mkdir -p "$root"
root="$(cd "$root" && pwd -P)"
: "${DOCKER_HOST:?set DOCKER_HOST first: eval \"\$(.ci/docker-setup.sh WORKDIR)\"}"

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache_dir="$repo_root/build/test-images"
image=raygen-test/hpc-apptainer
node="raygen-hpc-node-$(echo -n "$root" | sha256sum | cut -c1-8)"
uid="$(id -u)"
gid="$(id -g)"
docker_bin="$(command -v docker)"

if (( stop )); then
    docker rm -f "$node" >/dev/null 2>&1 && log "removed $node" || log "no $node"
    exit 0
fi

build_node_image() {
    if docker image inspect "$image" >/dev/null 2>&1; then return; fi
    local tarball="$cache_dir/sid-apptainer.tar"
    mkdir -p "$cache_dir"
    if [[ ! -s "$tarball" ]]; then
        command -v debootstrap >/dev/null || { log "debootstrap missing: make system-deps"; exit 1; }
        local mirror
        mirror="$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)"
        mirror="${mirror:-http://deb.debian.org/debian}"
        local rootfs="$cache_dir/sid-rootfs.tmp"
        rm -rf "$rootfs"
        log "debootstrap sid minbase + apptainer from $mirror (~2.5 min)"
        # squashfuse mounts SIF files and fuse-overlayfs gives --writable-tmpfs without privileges.
        debootstrap --variant=minbase \
            --include=apptainer,squashfs-tools,squashfuse,fuse2fs,fuse-overlayfs,fuse3 \
            sid "$rootfs" "$mirror" >&2
        rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
        # A user with subordinate ids, for callers that are not root (apptainer's user-namespace mode).
        echo "u:x:1000:1000::/tmp:/bin/sh" >>"$rootfs/etc/passwd"
        echo "u:x:1000:" >>"$rootfs/etc/group"
        echo "u:100000:65536" >"$rootfs/etc/subuid"
        cp "$rootfs/etc/subuid" "$rootfs/etc/subgid"
        # Temporary name first so an interrupted run never leaves a truncated cache.
        tar -C "$rootfs" -cf "$tarball.tmp" .
        mv "$tarball.tmp" "$tarball"
        rm -rf "$rootfs"
    fi
    docker import -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        "$tarball" "$image" >/dev/null
    log "built $image"
}

start_node() {
    local want have
    want="$(docker image inspect -f '{{.Id}}' "$image")"
    have="$(docker inspect -f '{{.Image}} {{.State.Running}}' "$node" 2>/dev/null || true)"
    if [[ "$have" == "$want true" ]]; then return; fi
    docker rm -f "$node" >/dev/null 2>&1 || true
    docker run -d --name "$node" --init --network none --device /dev/fuse \
        --security-opt seccomp=unconfined --security-opt apparmor=unconfined \
        --security-opt systempaths=unconfined --label raygen-test.fixture=hpc-node \
        -v "$root:$root" "$image" sleep infinity >/dev/null
    # The caller's uid must exist in the node (apptainer looks itself up) and reach /dev/fuse.
    docker exec -u 0 "$node" sh -c "
        chmod 666 /dev/fuse
        grep -q '^[^:]*:x:$uid:' /etc/passwd || echo 'caller:x:$uid:$gid::/tmp/home-$uid:/bin/sh' >>/etc/passwd
        grep -q '^[^:]*:x:$gid:' /etc/group || echo 'caller:x:$gid:' >>/etc/group
        if [ $uid != 0 ]; then
            mkdir -p /tmp/home-$uid && chown $uid:$gid /tmp/home-$uid
            name=\$(awk -F: '\$3 == $uid {print \$1; exit}' /etc/passwd)
            grep -q \"^\$name:\" /etc/subuid || echo \"\$name:200000:65536\" >>/etc/subuid
            grep -q \"^\$name:\" /etc/subgid || echo \"\$name:200000:65536\" >>/etc/subgid
        fi"
    log "started node container $node"
}

write_wrapper() {
    local home=/root
    [[ "$uid" == 0 ]] || home="/tmp/home-$uid"
    mkdir -p "$root/bin"
    cat >"$root/bin/apptainer.tmp" <<EOF
#!/usr/bin/env bash
# Generated by .ci/apptainer-setup.sh: runs the real apptainer in the "HPC node" container $node.
# Variables named APPTAINER*/SINGULARITY* are forwarded by name; relative paths work under $root.
export DOCKER_HOST='$DOCKER_HOST'
forward=()
for name in \$(compgen -e); do
    case "\$name" in APPTAINER*|SINGULARITY*) forward+=(-e "\$name") ;; esac
done
exec '$docker_bin' exec -i -u $uid:$gid -e HOME=$home "\${forward[@]}" '$node' \\
    sh -c 'cd "\$1" 2>/dev/null || cd /; shift; exec apptainer "\$@"' apptainer "\$PWD" "\$@"
EOF
    chmod 755 "$root/bin/apptainer.tmp"
    mv "$root/bin/apptainer.tmp" "$root/bin/apptainer"
}

build_test_images() {
    local images="$root/images" app="$root/bin/apptainer"
    mkdir -p "$images" "$root/work" "$root/cache"
    if [[ ! -s "$images/busybox.tar" ]]; then
        docker save raygen-test/busybox -o "$images/busybox.tar.tmp"
        mv "$images/busybox.tar.tmp" "$images/busybox.tar"
    fi
    if [[ ! -d "$images/busybox-sandbox/.singularity.d" ]]; then
        rm -rf "$images/busybox-sandbox"
        "$app" build --sandbox "$images/busybox-sandbox" "docker-archive://$images/busybox.tar" >&2
    fi
    if [[ ! -s "$images/debian.sif" ]]; then
        if [[ -s "$cache_dir/debian-python3.sif" ]]; then
            cp "$cache_dir/debian-python3.sif" "$images/debian.sif.tmp"
        else
            log "building debian.sif from raygen-test/python (~30-60 s)"
            docker save raygen-test/python -o "$images/python.tar"
            rm -f "$images/debian.sif.tmp"
            "$app" build "$images/debian.sif.tmp" "docker-archive://$images/python.tar" >&2
            rm -f "$images/python.tar"
            cp "$images/debian.sif.tmp" "$cache_dir/debian-python3.sif.tmp"
            mv "$cache_dir/debian-python3.sif.tmp" "$cache_dir/debian-python3.sif"
        fi
        mv "$images/debian.sif.tmp" "$images/debian.sif"
    fi
}

build_node_image
start_node
write_wrapper
build_test_images
"$root/bin/apptainer" version >/dev/null || { log "the wrapper does not work"; exit 1; }
log "ready: $root/bin/apptainer ($("$root/bin/apptainer" version)) in $node"
echo "export RAYGEN_HPC_ROOT=$root PATH=$root/bin:\$PATH"
