#!/usr/bin/env bash
# Stop the localhost Slurm cluster started by slurm/start-cluster.sh.
#
#   bash slurm/stop-cluster.sh            # cancel all jobs, stop daemons (state kept)
#   PURGE=1 bash slurm/stop-cluster.sh    # ... and wipe $SLURM_CI_BASE (state, logs, database)
#
# Stops daemons only through their PID files under $SLURM_CI_BASE (default
# /tmp/diffsweep-slurm). Idempotent: fine when nothing is running.
set -euo pipefail

# shellcheck source=slurm/lib.sh
source "$(dirname "$0")/lib.sh"
need_root "$0" "$@"
PURGE=${PURGE:-0}

# 1. Cancel every job first: stopping slurmd does not kill running jobs' slurmstepd.
if [ -f "$SLURM_CONF" ] && command -v squeue >/dev/null 2>&1 \
   && pid_alive "$(pid_of "$BASE/run/slurmctld.pid")" slurmctld; then
  jobs=$(squeue -h -o %F 2>/dev/null | sort -u | tr '\n' ' ' || true)
  if [ -n "${jobs// /}" ]; then
    say "cancelling jobs: $jobs"
    # shellcheck disable=SC2086
    scancel $jobs 2>/dev/null || true
    end=$(( $(date +%s) + 30 ))
    while [ -n "$(squeue -h -t R,CG,S,CF,SO -o %i 2>/dev/null || true)" ]; do
      if [ "$(date +%s)" -ge "$end" ]; then say "jobs still ending after 30 s; stopping anyway"; break; fi
      sleep 0.2
    done
  fi
fi

# 2. Daemons, in dependency order.
stop_daemon slurmd "$BASE/run/slurmd.pid" slurmd 30
stop_daemon slurmctld "$BASE/run/slurmctld.pid" slurmctld 30
stop_daemon slurmdbd "$BASE/run/slurmdbd.pid" slurmdbd 30
stop_daemon mariadbd "$BASE/mysql/run/mariadbd.pid" mariadbd 30
stop_daemon munged "$BASE/munge/run/munged.pid" munged 30

# 3. Optional wipe.
if [ "$PURGE" = 1 ] && [ -e "$BASE" ]; then
  [ -e "$BASE/.diffsweep-slurm" ] || die "$BASE lacks the .diffsweep-slurm marker; not wiping it"
  say "purging $BASE"
  rm -rf -- "$BASE"
fi
say "stopped"
