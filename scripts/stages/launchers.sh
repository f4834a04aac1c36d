#!/usr/bin/env bash
# The launcher stage: accel.distributed under the real Open MPI and SLURM, on this machine.
#   bash scripts/stages/launchers.sh [PYTEST_ARGS...]     (or: bash scripts/test launchers)
# Installs Open MPI, SLURM and munge with apt-get where missing (root only), starts
# munged, slurmctld and slurmd from a private directory with their own config, key,
# socket and loopback ports, waits for the node to be idle, runs
# tests/distributed/test_real_launchers.py (pytest marker `launchers`) against them,
# and stops exactly the daemons it started, by the pids it recorded. About 5.5 minutes
# on 2 idle cores (the two preemption tests' requeued jobs 3 of them; both run the
# batch script docs/training.md shows), nearer 7 on a busy machine.
set -euo pipefail
cd "$(dirname "$0")/../.."
repo="$(pwd)"

# -- the programs ------------------------------------------------------------------

need_packages=()
command -v mpirun >/dev/null || need_packages+=(openmpi-bin)
for program in slurmctld:slurm-wlm slurmd:slurm-wlm srun:slurm-client munged:munge; do
    command -v "${program%%:*}" >/dev/null || need_packages+=("${program#*:}")
done
if ((${#need_packages[@]})); then
    if [[ $(id -u) -ne 0 ]]; then
        echo "error: the launcher stage needs Open MPI, SLURM and munge; as root run:" >&2
        echo "  apt-get update && apt-get install -y openmpi-bin slurm-wlm munge" >&2
        exit 1
    fi
    echo "== installing ${need_packages[*]} (apt-get)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openmpi-bin slurm-wlm munge >/dev/null
fi
if [[ $(id -u) -ne 0 ]]; then
    # slurmd must start job steps as any user, so it runs as root.
    echo "error: the launcher stage starts slurmd, which must run as root; run it as root" >&2
    exit 1
fi
main_env="$(scripts/ensure-env requirements/main.txt)"

# -- leftovers of an earlier run of this stage ---------------------------------------

# A run killed before its trap ran (kill -9) leaves its daemons behind, and the steps
# of a job it was running. Each run records its private directory and the pids of the
# daemons it started here; stop those daemons if they still run from that directory
# (a pid reused by another program is left alone), and the processes of that run's
# cluster: slurmstepd and the job's own, which carry its SLURM_CONF.
record="${TMPDIR:-/tmp}/accel-launchers-stage.pids"
# One run at a time (another worktree's run must not take this one's daemons for
# leftovers). The lock is this shell's alone: every child closes fd 8, so a run
# killed with -9 frees it at once, whatever it left running.
exec 8>"$record.lock"
if ! flock --wait 900 8; then
    echo "error: another launcher stage run has held $record.lock for 15 minutes" >&2
    exit 1
fi
runs_from() {  # runs_from PID DIR: the process's command line or SLURM_CONF names DIR
    [[ -r /proc/$1/cmdline ]] || return 1
    tr '\0' ' ' <"/proc/$1/cmdline" | grep -qF "$2" && return 0
    tr '\0' '\n' <"/proc/$1/environ" 2>/dev/null | grep -qxF "SLURM_CONF=$2/slurm.conf"
}
if [[ -f $record ]]; then
    old_dir="$(head -n1 "$record")"
    leftovers=()
    for pid in $(tail -n +2 "$record") $(ls /proc | grep -E '^[0-9]+$'); do
        [[ $pid != "$$" ]] && runs_from "$pid" "$old_dir" && leftovers+=("$pid")
    done
    if ((${#leftovers[@]})); then
        echo "== stopping ${#leftovers[@]} processes left over from an earlier run ($old_dir)"
        kill -9 "${leftovers[@]}" 2>/dev/null || true
    fi
    rm -rf "$old_dir" "$record"
fi

# -- the private cluster -------------------------------------------------------------

dir="$(mktemp -d "${TMPDIR:-/tmp}/accel-launchers.XXXXXX")"
# munged refuses a socket in a directory others cannot traverse; nobody else can list it.
chmod 0711 "$dir"
pids=()
stop_daemons() {
    local status=$?
    if [[ -n ${SLURM_CONF:-} ]]; then
        # A test that timed out may leave its job running: cancel every job of this
        # private cluster, so that no step outlives its slurmd.
        jobs="$(timeout 10 squeue --noheader --format %i 2>/dev/null || true)"
        if [[ -n $jobs ]]; then
            # shellcheck disable=SC2086
            timeout 10 scancel --full $jobs 2>/dev/null || true
            for _ in $(seq 30); do
                [[ -z "$(timeout 5 squeue --noheader 2>/dev/null)" ]] && break
                sleep 0.5
            done
        fi
    fi
    for pid in "${pids[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    for pid in "${pids[@]}"; do  # wait (bounded) until each one is gone
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$pid" 2>/dev/null || true
    done
    if [[ $status -ne 0 ]]; then
        for log in "$dir"/*.log; do
            [[ -f $log ]] && { echo "-- $log (last lines)"; tail -n 15 "$log"; }
        done
    fi
    rm -rf "$dir" "$record"
    exit "$status"
}
trap stop_daemons EXIT
started() {  # record a daemon's pid, for the trap and for the next run's cleanup
    pids+=("$1")
    echo "$1" >>"$record"
}
echo "$dir" >"$record"

free_port() {
    "$main_env/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

echo "== munged, slurmctld, slurmd in $dir"
mkdir -p "$dir/state" "$dir/spool"
dd if=/dev/urandom of="$dir/munge.key" bs=1024 count=1 status=none
chmod 0400 "$dir/munge.key"
munged --foreground --socket="$dir/munge.sock" --key-file="$dir/munge.key" \
    --pid-file="$dir/munged.pid" --log-file="$dir/munged.log" --seed-file="$dir/munge.seed" \
    >>"$dir/munged.log" 2>&1 8>&- &
started $!

memory_mb=$(($(awk '/^MemTotal:/ {print $2}' /proc/meminfo) / 1024 * 9 / 10))
cat >"$dir/slurm.conf" <<EOF
ClusterName=accel-test
SlurmctldHost=localhost
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire: a requeued job waits this long before it may start again (120 s by
# default); each preemption test requeues its job once.
AuthInfo=socket=$dir/munge.sock,cred_expire=15
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/pgid
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
# A requeued job becomes eligible when its wait ends, which no event announces: the
# main scheduling loop (every 60 s by default) starts it.
SchedulerParameters=sched_interval=2
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
InactiveLimit=0
KillWait=5
# The preemption test's job has a 1-minute limit and is signalled up to 60 s early
# (SLURM's resolution): a minute past the limit before the job is killed, so that a
# late signal still leaves time to save and requeue.
OverTimeLimit=1
JobRequeue=1
MinJobAge=5
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$(nproc) RealMemory=$memory_mb State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOF
export SLURM_CONF="$dir/slurm.conf"
for _ in $(seq 50); do [[ -S $dir/munge.sock ]] && break; sleep 0.1; done
if ! munge --socket="$dir/munge.sock" --no-input | unmunge --socket="$dir/munge.sock" >/dev/null; then
    echo "error: munged did not start (see $dir/munged.log above)" >&2
    exit 1
fi
slurmctld -D -i -f "$SLURM_CONF" >>"$dir/slurmctld.log" 2>&1 8>&- &
started $!
slurmd -D -N localhost -f "$SLURM_CONF" >>"$dir/slurmd.log" 2>&1 8>&- &
started $!

idle=""
for _ in $(seq 60); do
    idle="$(timeout 5 sinfo --noheader --nodes localhost --format %T 2>/dev/null || true)"
    [[ $idle == idle ]] && break
    sleep 1
done
if [[ $idle != idle ]]; then
    echo "error: the SLURM node did not become idle in 60 s (state: '${idle:-none}')" >&2
    exit 1
fi
echo "== SLURM node idle; Open MPI $(mpirun --version | head -n1 | awk '{print $NF}'), $(sinfo --version)"

# -- the tests -----------------------------------------------------------------------

export ACCEL_LAUNCHERS_STAGE=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"  # this tree's accel, whatever the venv holds
status=0
(cd "$repo" && timeout 600 "$main_env/bin/python" -m pytest -p no:cacheprovider -p no:accel \
    tests/distributed/test_real_launchers.py -m launchers "$@") 8>&- || status=$?
if [[ $status -eq 5 ]]; then
    echo "error: the launcher stage collected no tests (pytest exit 5); that is a failure" >&2
    exit 1
fi
exit "$status"
