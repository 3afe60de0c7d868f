#!/usr/bin/env bash
# Stop the cluster that ci/slurm/up.sh started under STATE_DIR: cancel its jobs, then end slurmd, slurmctld and
# munged, each by the pid in its pid file (only if that pid still runs that program), waiting for each to exit.
# Safe to run twice or after a failed start.
set -uo pipefail

BASE=${1:?usage: down.sh STATE_DIR}
export PATH="/usr/sbin:/sbin:$PATH"
[ -d "$BASE" ] || exit 0

pid_of() { # pid_of NAME: pid from run/NAME.pid if that process is NAME, else nothing
  local f="$BASE/run/$1.pid" pid
  [ -s "$f" ] || return 1
  pid=$(cat "$f")
  [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$1" ] || return 1
  echo "$pid"
}

# Jobs first: their slurmstepd processes outlive slurmd.
if [ -s "$BASE/etc/slurm.conf" ] && pid_of slurmctld >/dev/null; then
  export SLURM_CONF="$BASE/etc/slurm.conf"
  if [ -n "$(squeue -h -t RUNNING,PENDING,COMPLETING -o %i 2>/dev/null)" ]; then
    squeue -h -o %i | xargs -r scancel --full 2>/dev/null || true
    for _ in $(seq 60); do
      [ -z "$(squeue -h -t RUNNING,PENDING,COMPLETING -o %i 2>/dev/null)" ] && break
      sleep 0.25
    done
  fi
fi

for name in slurmd slurmctld munged; do
  pid=$(pid_of "$name") || continue
  kill "$pid" 2>/dev/null || continue
  for _ in $(seq 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
  if kill -0 "$pid" 2>/dev/null; then
    kill -9 "$pid" 2>/dev/null
    echo "down.sh: $name ($pid) ignored SIGTERM for 10 s, killed" >&2
  fi
  echo "stopped $name ($pid)"
done
