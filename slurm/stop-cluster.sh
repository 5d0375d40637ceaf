#!/usr/bin/env bash
# Stop the localhost Slurm cluster started by slurm/start-cluster.sh.
#
#   bash slurm/stop-cluster.sh            # cancel all jobs, stop daemons (state kept)
#   PURGE=1 bash slurm/stop-cluster.sh    # ... and wipe $SLURM_CI_BASE (state, logs, database)
#
# Stops daemons only through their PID files under $SLURM_CI_BASE (default
# /tmp/diffsweep-slurm). Idempotent: fine when nothing is running.
set -euo pipefail

say() { printf '[slurm] %s\n' "$*"; }
die() { printf '[slurm] ERROR: %s\n' "$*" >&2; exit 1; }

if [ "$(id -u)" != 0 ]; then
  command -v sudo >/dev/null 2>&1 || die "must run as root (no sudo available)"
  exec sudo -E bash "$0" "$@"
fi

export PATH="$PATH:/usr/sbin:/sbin:/usr/bin:/bin"
BASE=${SLURM_CI_BASE:-/tmp/diffsweep-slurm}
case "$BASE" in /?*) ;; *) die "SLURM_CI_BASE must be an absolute path" ;; esac
BASE=${BASE%/}
PURGE=${PURGE:-0}
export SLURM_CONF="$BASE/etc/slurm.conf"

# A PID is "alive" only if it is not a zombie and its comm matches (see start-cluster.sh).
pid_alive() { # pid comm
  local pid=$1 comm=$2 st
  [ -n "$pid" ] && [ -r "/proc/$pid/stat" ] || return 1
  st=$(sed -E 's/^[0-9]+ \(.*\) (.).*/\1/' "/proc/$pid/stat" 2>/dev/null) || return 1
  [ "$st" != Z ] || return 1
  [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$comm" ]
}
pid_of() { [ -r "$1" ] && tr -dc 0-9 <"$1" || true; }
stop_daemon() { # name pidfile comm   (waits on the PID: slurmdbd removes its pid file itself)
  local name=$1 pf=$2 comm=$3 pid i
  pid=$(pid_of "$pf")
  if pid_alive "$pid" "$comm"; then
    say "stopping $name (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    for i in $(seq 1 300); do pid_alive "$pid" "$comm" || break; sleep 0.1; done
    if pid_alive "$pid" "$comm"; then
      say "$name did not exit in 30 s: SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
      for i in $(seq 1 50); do pid_alive "$pid" "$comm" || break; sleep 0.1; done
    fi
  fi
  rm -f "$pf"
}

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
stop_daemon slurmd "$BASE/run/slurmd.pid" slurmd
stop_daemon slurmctld "$BASE/run/slurmctld.pid" slurmctld
stop_daemon slurmdbd "$BASE/run/slurmdbd.pid" slurmdbd
stop_daemon mariadbd "$BASE/mysql/run/mariadbd.pid" mariadbd
stop_daemon munged "$BASE/munge/run/munged.pid" munged

# 3. Optional wipe.
if [ "$PURGE" = 1 ] && [ -e "$BASE" ]; then
  [ -e "$BASE/.diffsweep-slurm" ] || die "$BASE lacks the .diffsweep-slurm marker; not wiping it"
  say "purging $BASE"
  rm -rf -- "$BASE"
fi
say "stopped"
