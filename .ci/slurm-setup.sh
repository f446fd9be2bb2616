#!/usr/bin/env bash
# Install (if missing) and start a private single-machine Slurm (munge + slurmctld + slurmd on loopback)
# whose configuration, state, logs and sockets all live under WORKDIR.
#
# Usage:  eval "$(.ci/slurm-setup.sh WORKDIR)"            # sets SLURM_CONF for this shell
#         eval "$(.ci/slurm-setup.sh --nodes 2 WORKDIR)"  # two Slurm nodes on this machine (if slurmd allows)
#         .ci/slurm-setup.sh --install-only                # only the Debian packages
#         .ci/slurm-setup.sh --stop WORKDIR                # stop the daemons this WORKDIR started
#
# Idempotent: a second call finds the controller answering and only prints the export. Ports are off the
# Slurm defaults (SLURM_SETUP_CTLD_PORT, default 16817; slurmd i listens on SLURM_SETUP_SLURMD_PORT + i,
# default 16818) so a site Slurm on the same machine is untouched, and munged uses a private socket.
# Daemons started inside a network namespace (`unshare -n`) only answer inside it: call this from the
# same namespace as the jobs' clients. Everything but the final `export` line goes to stderr.
set -euo pipefail

log() { echo "slurm-setup: $*" >&2; }
die() { log "$*"; exit 1; }

mode=start
nodes=1
while [[ $# -gt 0 ]]; do
    case "$1" in
        --stop) mode=stop; shift ;;
        --install-only) mode=install; shift ;;
        --nodes) nodes="${2:?--nodes needs a number}"; shift 2 ;;
        -*) die "unknown option $1" ;;
        *) break ;;
    esac
done

install_packages() {
    if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null \
        && command -v sbatch >/dev/null; then
        return
    fi
    log "installing slurm-wlm and munge"
    export DEBIAN_FRONTEND=noninteractive
    local packages=(slurm-wlm munge)
    if ! apt-cache show slurm-wlm >/dev/null 2>&1; then apt-get update -qq >&2; fi
    if ! apt-get install -y -qq --no-install-recommends "${packages[@]}" >&2; then
        apt-get update -qq >&2
        apt-get install -y -qq --no-install-recommends "${packages[@]}" >&2
    fi
}

if [[ "$mode" == install ]]; then
    install_packages
    exit 0
fi

workdir="${1:?usage: slurm-setup.sh [--nodes N|--stop|--install-only] WORKDIR}"
mkdir -p "$workdir"
workdir="$(cd "$workdir" && pwd)"
conf="$workdir/slurm.conf"
export SLURM_CONF="$conf"

alive() { [[ -s "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

stop_pidfile() {
    local pidfile="$1" pid
    alive "$pidfile" || return 0
    pid="$(cat "$pidfile")"
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null
    log "stopped $(basename "$pidfile" .pid) (pid $pid)"
}

if [[ "$mode" == stop ]]; then
    for pidfile in "$workdir"/slurmd-*.pid "$workdir/slurmctld.pid" "$workdir/munge/munged.pid"; do
        [[ -e "$pidfile" ]] && stop_pidfile "$pidfile"
    done
    exit 0
fi

install_packages

controller_up() { scontrol ping 2>/dev/null | grep -q "is UP"; }

if alive "$workdir/slurmctld.pid" && controller_up; then
    log "slurmctld already running for $workdir"
    echo "export SLURM_CONF=$conf"
    exit 0
fi

host="$(hostname -s)"
ctld_port="${SLURM_SETUP_CTLD_PORT:-16817}"
slurmd_port="${SLURM_SETUP_SLURMD_PORT:-16818}"
mkdir -p "$workdir/state" "$workdir/spool" "$workdir/munge"

# munge: the package's key, or a fresh one for this workdir; a private socket, so a site munged is untouched.
chown munge:munge "$workdir/munge" && chmod 700 "$workdir/munge"
key=/etc/munge/munge.key
if [[ ! -s "$key" ]]; then
    key="$workdir/munge/munge.key"
    [[ -s "$key" ]] || { dd if=/dev/urandom of="$key" bs=1024 count=1 status=none; }
    chown munge:munge "$key" && chmod 400 "$key"
fi
socket="$workdir/munge/munge.socket"
if ! alive "$workdir/munge/munged.pid"; then
    rm -f "$socket" "$socket.lock"
    # --force: munged refuses socket folders below a world-writable /tmp otherwise.
    runuser -u munge -- munged --force --socket="$socket" --key-file="$key" \
        --pid-file="$workdir/munge/munged.pid" --log-file="$workdir/munge/munged.log" \
        --seed-file="$workdir/munge/munged.seed" >&2
fi
for _ in $(seq 1 50); do [[ -S "$socket" ]] && break; sleep 0.1; done
[[ -S "$socket" ]] || die "munged did not start; see $workdir/munge/munged.log"

node_lines=""
node_names=()
if (( nodes == 1 )); then
    node_names=("$host")
    node_lines="NodeName=$host NodeAddr=127.0.0.1 Port=$slurmd_port CPUs=2 RealMemory=20000 State=UNKNOWN"
else
    # Several slurmd on one machine: distinct names and ports, the same host (needs multiple-slurmd support).
    for i in $(seq 1 "$nodes"); do
        node_names+=("rg$i")
        node_lines+="NodeName=rg$i NodeHostname=$host NodeAddr=127.0.0.1 Port=$((slurmd_port + i - 1))"
        node_lines+=" CPUs=2 RealMemory=20000 State=UNKNOWN"$'\n'
    done
fi

cat >"$conf" <<EOF
# Written by .ci/slurm-setup.sh: a private Slurm on loopback for tests.
ClusterName=raygen-ci
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$socket
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$workdir/state
SlurmdSpoolDir=$workdir/spool/%n
SlurmctldPidFile=$workdir/slurmctld.pid
SlurmdPidFile=$workdir/slurmd-%n.pid
SlurmctldLogFile=$workdir/slurmctld.log
SlurmdLogFile=$workdir/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
MpiDefault=none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MailProg=/bin/true
# Slurm resolves its listening address with AF_INET + AI_ADDRCONFIG, which finds nothing in a loopback-only
# network namespace (no non-loopback IPv4 address); with IPv6 enabled it asks AF_UNSPEC, which works.
CommunicationParameters=EnableIPv6
ReturnToService=2
# Seconds between SIGTERM and SIGKILL when a job is cancelled: the sbatch script's cleanup runs in it.
KillWait=20
SlurmdTimeout=60
$node_lines
PartitionName=ci Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF

if ! alive "$workdir/slurmctld.pid"; then
    log "starting slurmctld (log: $workdir/slurmctld.log)"
    slurmctld -f "$conf" -i >&2   # -i: ignore state a previous controller in this workdir left
fi
for _ in $(seq 1 300); do controller_up && break; sleep 0.1; done
controller_up || { tail -n 20 "$workdir/slurmctld.log" >&2 || true; die "slurmctld did not answer within 30 s"; }

for name in "${node_names[@]}"; do
    if ! alive "$workdir/slurmd-$name.pid"; then
        log "starting slurmd $name (log: $workdir/slurmd-$name.log)"
        if (( nodes == 1 )); then slurmd -f "$conf" >&2; else slurmd -f "$conf" -N "$name" >&2; fi
    fi
done

# Bounded wait for every node to be idle (a node the controller remembers as down is resumed).
idle=0
for _ in $(seq 1 300); do
    states="$(sinfo -h -N -o '%N %T' 2>/dev/null || true)"
    idle="$(grep -c ' idle$' <<<"$states" || true)"
    (( idle >= ${#node_names[@]} )) && break
    if grep -qE ' (down|drained)' <<<"$states"; then
        scontrol update nodename="$(IFS=,; echo "${node_names[*]}")" state=resume 2>/dev/null || true
    fi
    sleep 0.2
done
if (( idle < ${#node_names[@]} )); then
    sinfo -N >&2 || true
    tail -n 20 "$workdir"/slurmd-*.log >&2 || true
    die "not every Slurm node became idle within 60 s"
fi
log "slurm ready: ${#node_names[@]} node(s) idle"
echo "export SLURM_CONF=$conf"
