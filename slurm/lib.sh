# Shared by start-cluster.sh and stop-cluster.sh (sourced, not run): messages, root, the state
# directory, and daemons tracked by PID file.

say() { printf '[slurm] %s\n' "$*"; }
die() { printf '[slurm] ERROR: %s\n' "$*" >&2; exit 1; }

# Daemons run as root (SlurmUser=root). Re-run the calling script under sudo if needed.
need_root() { # "$0" "$@"
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null 2>&1 || die "must run as root (no sudo available)"
    say "not root: re-running under sudo"
    exec sudo -E bash "$@"
  fi
}

export PATH="$PATH:/usr/sbin:/sbin:/usr/bin:/bin"
BASE=${SLURM_CI_BASE:-/tmp/diffsweep-slurm}
case "$BASE" in /?*) ;; *) die "SLURM_CI_BASE must be an absolute path" ;; esac
BASE=${BASE%/}
export SLURM_CONF="$BASE/etc/slurm.conf"

# A PID is "alive" only if /proc says it is not a zombie and its comm matches: the
# daemons fork away to PID 1, which may reap them late, and kill -0 sees zombies.
pid_alive() { # pid comm
  local pid=$1 comm=$2 st
  [ -n "$pid" ] && [ -r "/proc/$pid/stat" ] || return 1
  st=$(sed -E 's/^[0-9]+ \(.*\) (.).*/\1/' "/proc/$pid/stat" 2>/dev/null) || return 1
  [ "$st" != Z ] || return 1
  [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$comm" ]
}
pid_of() { # pidfile -> pid ('' if none)
  [ -r "$1" ] && tr -dc 0-9 <"$1" || true
}
running() { # pidfile comm
  pid_alive "$(pid_of "$1")" "$2"
}
stop_daemon() { # name pidfile comm [timeout_s]  (waits on the PID: slurmdbd removes its pid file itself)
  local name=$1 pf=$2 comm=$3 timeout=${4:-20} pid i
  pid=$(pid_of "$pf")
  if pid_alive "$pid" "$comm"; then
    say "stopping $name (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    for i in $(seq 1 $((timeout * 10))); do pid_alive "$pid" "$comm" || break; sleep 0.1; done
    if pid_alive "$pid" "$comm"; then
      say "$name did not exit in $timeout s: SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
      for i in $(seq 1 50); do pid_alive "$pid" "$comm" || break; sleep 0.1; done
    fi
  fi
  rm -f "$pf"
}
