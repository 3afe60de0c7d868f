#!/usr/bin/env bash
# Start a throw-away single-node Slurm cluster (Debian 12 packages slurmctld, slurmd, slurm-client, munge) as plain
# background processes, all state under one folder. Used by tests/workflow/test_slurm.py; usable by hand:
#
#   ci/slurm/up.sh /tmp/cluster          # start; prints what it started
#   . /tmp/cluster/env.sh                # SLURM_CONF + PATH (srun wrapper) for sbatch/squeue/snakemake
#   ci/slurm/down.sh /tmp/cluster        # stop exactly the daemons started here (pid files), cancel leftover jobs
#
# The node is this machine (`slurmd -C`), in two partitions: `cpu` (default) and `gpu`, and advertises
# $SLURM_FAKE_GPUS fake GPUs of type $SLURM_GPU_TYPE (gres device files are symlinks to /dev/null) with the node
# feature of the same name. No slurmdbd: `sacct` does not work, use the plugin's `--slurm-status-command squeue`
# (MinJobAge keeps finished jobs visible to squeue/scontrol). Needs root (slurmd runs jobs as their users).
# Environment: SLURM_GPU_TYPE (h100), SLURM_FAKE_GPUS (2), SLURMCTLD_PORT (6817), SLURMD_PORT (6818),
#              SLURM_MIN_JOB_AGE (3600 s), SLURM_NODE_CPUS (the machine's; more lets more jobs overlap).
set -euo pipefail

BASE=${1:?usage: up.sh STATE_DIR}
mkdir -p "$BASE"
BASE=$(cd "$BASE" && pwd)
GPU_TYPE=${SLURM_GPU_TYPE:-h100}
NGPU=${SLURM_FAKE_GPUS:-2}
CTLD_PORT=${SLURMCTLD_PORT:-6817}
SLURMD_PORT=${SLURMD_PORT:-6818}
MIN_JOB_AGE=${SLURM_MIN_JOB_AGE:-3600}
NODE_CPUS=${SLURM_NODE_CPUS:-}
export PATH="/usr/sbin:/sbin:$PATH"

die() { echo "up.sh: $*" >&2; exit 1; }
wait_until() { # wait_until SECONDS CMD... : poll every 0.25 s
  local deadline=$((SECONDS + $1)); shift
  until "$@" >/dev/null 2>&1; do
    [ "$SECONDS" -lt "$deadline" ] || return 1
    sleep 0.25
  done
}

[ "$(id -u)" = 0 ] || die "needs root (slurmd runs jobs as their users)"
for b in munged mungekey slurmctld slurmd sbatch srun squeue sinfo scontrol scancel; do
  command -v "$b" >/dev/null || die "$b not found: apt-get install slurmctld slurmd slurm-client munge"
done
for f in run/munged.pid run/slurmctld.pid run/slurmd.pid; do
  if [ -s "$BASE/$f" ] && kill -0 "$(cat "$BASE/$f")" 2>/dev/null; then
    die "$BASE already runs a cluster ($f); stop it with ci/slurm/down.sh $BASE"
  fi
done

rm -rf "$BASE"/{etc,spool,log,run,munge,dev,bin}
mkdir -p "$BASE"/{etc,spool/ctld,spool/d,log,run,munge,dev,bin}

# munge: own key and socket. munged runs as root (--force): it only serves this root-only test cluster, and the
# munge user could not reach a state folder under a private (0700) temp directory.
mungekey -c -k "$BASE/munge/munge.key"
chmod 755 "$BASE/munge"
chmod 400 "$BASE/munge/munge.key"
munged --force --key-file="$BASE/munge/munge.key" --socket="$BASE/munge/munge.socket" \
  --pid-file="$BASE/run/munged.pid" --log-file="$BASE/log/munged.log" --seed-file="$BASE/munge/munged.seed"
wait_until 10 test -S "$BASE/munge/munge.socket" || die "munged did not start: $(tail -5 "$BASE/log/munged.log")"

# Fake GPUs: gres entries need device files (a count-only entry is dropped, a regular file refused).
gpu_last=$((NGPU - 1))
for i in $(seq 0 "$gpu_last"); do ln -s /dev/null "$BASE/dev/gpu$i"; done

HOST=$(hostname -s)
NODE_HW=$(slurmd -C | head -1)        # NodeName=<host> CPUs=.. Boards=.. ... RealMemory=..
OVERRIDES=""
if [ -n "$NODE_CPUS" ]; then  # advertise more CPUs than the machine has (slurmd accepts that with config_overrides)
  NODE_HW="NodeName=$HOST CPUs=$NODE_CPUS $(sed -E 's/.*(RealMemory=[0-9]+).*/\1/' <<<"$NODE_HW")"
  OVERRIDES="SlurmdParameters=config_overrides"
fi
export SLURM_CONF="$BASE/etc/slurm.conf"
cat > "$SLURM_CONF" <<EOF
# Written by ci/slurm/up.sh: single-node test cluster, state under $BASE
ClusterName=retinabench-ci
SlurmctldHost=$HOST(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$BASE/munge/munge.socket
StateSaveLocation=$BASE/spool/ctld
SlurmdSpoolDir=$BASE/spool/d
SlurmctldPidFile=$BASE/run/slurmctld.pid
SlurmdPidFile=$BASE/run/slurmd.pid
SlurmctldLogFile=$BASE/log/slurmctld.log
SlurmdLogFile=$BASE/log/slurmd.log
# pgid, not linuxproc: on scancel the batch shell dies first and linuxproc then loses its Snakemake child (which
# handles SIGTERM slowly), so that process would outlive the job. No cgroups needed either way.
ProctrackType=proctrack/pgid
TaskPlugin=task/none
MpiDefault=none
ReturnToService=2
MinJobAge=$MIN_JOB_AGE
KillWait=5
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=500
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
GresTypes=gpu
$OVERRIDES
$NODE_HW NodeAddr=127.0.0.1 Gres=gpu:$GPU_TYPE:$NGPU Features=$GPU_TYPE State=UNKNOWN
PartitionName=cpu Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
PartitionName=gpu Nodes=$HOST MaxTime=INFINITE State=UP
EOF
cat > "$BASE/etc/gres.conf" <<EOF
AutoDetect=off
NodeName=$HOST Name=gpu Type=$GPU_TYPE File=$BASE/dev/gpu[0-$gpu_last]
EOF

# The jobstep plugin drops every SLURM_* variable (SLURM_CONF too) before its `srun` inside a job; with the config
# outside /etc/slurm, srun then finds no configuration. This wrapper, first on PATH, puts it back.
cat > "$BASE/bin/srun" <<EOF
#!/bin/sh
SLURM_CONF=$SLURM_CONF exec /usr/bin/srun "\$@"
EOF
chmod +x "$BASE/bin/srun"
cat > "$BASE/env.sh" <<EOF
export SLURM_CONF=$SLURM_CONF
export PATH=$BASE/bin:\$PATH
EOF

slurmctld -i
wait_until 20 scontrol ping || die "slurmctld not answering: $(tail -5 "$BASE/log/slurmctld.log")"
slurmd
wait_until 30 bash -c "sinfo -h -n '$HOST' -o %T | grep -qx idle" \
  || die "node $HOST not idle: $(sinfo -h -n "$HOST" -o '%T %E'); $(tail -5 "$BASE/log/slurmd.log")"

echo "cluster up under $BASE: munged $(cat "$BASE/run/munged.pid"), slurmctld $(cat "$BASE/run/slurmctld.pid")," \
     "slurmd $(cat "$BASE/run/slurmd.pid") (ports $CTLD_PORT/$SLURMD_PORT; $(slurmd -V))"
sinfo -o '%P %a %D %T %c %m %G %f'
