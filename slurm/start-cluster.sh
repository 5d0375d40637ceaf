#!/usr/bin/env bash
# Start (or refresh) a real single-node Slurm cluster on localhost for tests/CI.
#
#   bash slurm/start-cluster.sh && source /tmp/diffsweep-slurm/env.sh
#
# Settings (environment):
#   SLURM_CI_BASE  state directory (default /tmp/diffsweep-slurm)
#   WITH_DBD=1|0   run slurmdbd + MariaDB so `sacct` works (default 1); with 0 a small
#                  `sacct` shim is put on PATH via env.sh instead
#   FAKE_GPUS=N    fake GPUs (GRES gpu, /dev/null-backed) on the node (default 2; 0 = none)
#   CPUS=N         CPUs the node advertises (default: nproc); above the real count uses
#                  SlurmdParameters=config_overrides
#   NO_INSTALL=1   never run apt-get; fail if packages are missing
#
# Idempotent: if the daemons are up and the generated config is unchanged it only checks
# the cluster; if the config changed it restarts the Slurm daemons.
set -euo pipefail

T0=$(date +%s.%N)
# shellcheck source=slurm/lib.sh
source "$(dirname "$0")/lib.sh"
need_root "$0" "$@"
elapsed() { awk -v a="$T0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}'; }

WITH_DBD=${WITH_DBD:-1}
FAKE_GPUS=${FAKE_GPUS:-2}
NO_INSTALL=${NO_INSTALL:-0}
case "$WITH_DBD" in 0|1) ;; *) die "WITH_DBD must be 0 or 1" ;; esac
case "$FAKE_GPUS" in ''|*[!0-9]*) die "FAKE_GPUS must be a number" ;; esac

MUNGE_SOCK="$BASE/munge/run/munge.socket.2"
MUNGE_KEY="$BASE/munge/etc/munge.key"
MYSQL_SOCK="$BASE/mysql/run/mysqld.sock"
HOST=$(hostname -s)
[ -n "$HOST" ] || die "hostname -s is empty"

# ---------------------------------------------------------------- helpers
wait_for() { # timeout_s description command...
  local t=$1 what=$2 end; shift 2
  end=$(( $(date +%s) + t ))
  until "$@" >/dev/null 2>&1; do
    if [ "$(date +%s)" -ge "$end" ]; then fail "timed out after ${t}s waiting for $what"; fi
    sleep 0.2
  done
}
port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
check_port() { # port daemon: the ports are fixed, so only one such cluster per host
  if port_busy "$1"; then
    fail "port $1 (for $2) is already in use: another cluster/server running (other SLURM_CI_BASE?)"
  fi
}
fail() {
  printf '[slurm] ERROR: %s\n' "$*" >&2
  local f
  for f in "$BASE"/log/{start,mariadbd,slurmdbd,slurmctld,slurmd}.log "$BASE"/munge/log/munged.log; do
    [ -s "$f" ] || continue
    printf -- '----- tail %s\n' "$f" >&2
    tail -n 25 "$f" >&2
  done
  exit 1
}

# ---------------------------------------------------------------- packages
PKGS=(slurmctld slurmd slurm-client munge)
if [ "$WITH_DBD" = 1 ]; then PKGS+=(slurmdbd slurm-wlm-mysql-plugin mariadb-server); fi
missing=()
for p in "${PKGS[@]}"; do
  [ "$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)" = installed ] || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  [ "$NO_INSTALL" = 1 ] && die "missing packages (NO_INSTALL=1): ${missing[*]}"
  command -v apt-get >/dev/null 2>&1 || die "missing packages and no apt-get: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # slurm-wlm-mysql-plugin is a separate package on Debian 12; skip it where apt does not know it
  inst=()
  for p in "${missing[@]}"; do
    if [ "$p" = slurm-wlm-mysql-plugin ] && ! apt-cache show "$p" >/dev/null 2>&1; then continue; fi
    inst+=("$p")
  done
  say "installing: ${inst[*]}"
  if ! compgen -G '/var/lib/apt/lists/*_Packages*' >/dev/null; then
    say "apt lists empty: apt-get update"; apt-get update -qq
  fi
  if ! apt-get install -y -qq --no-install-recommends "${inst[@]}" >"${TMPDIR:-/tmp}/slurm-apt.log" 2>&1; then
    say "install failed: apt-get update and retry"
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${inst[@]}" >"${TMPDIR:-/tmp}/slurm-apt.log" 2>&1 \
      || { tail -n 30 "${TMPDIR:-/tmp}/slurm-apt.log" >&2; die "apt-get install failed"; }
  fi
  say "packages installed ($(elapsed) s)"
fi
for c in slurmctld slurmd sinfo munged mungekey; do
  command -v "$c" >/dev/null 2>&1 || die "$c not found"
done
if [ "$WITH_DBD" = 1 ]; then
  for c in slurmdbd mariadbd mariadb-install-db mariadb sacctmgr; do
    command -v "$c" >/dev/null 2>&1 || die "$c not found"
  done
fi

# ---------------------------------------------------------------- directories, munge key
umask 022
mkdir -p "$BASE"/{etc,run,log,bin,state/ctld,state/d,fakegpu} "$BASE"/munge/{etc,run,log,lib}
chmod 0700 "$BASE"/munge/etc "$BASE"/munge/lib "$BASE"/munge/log
chmod 0755 "$BASE"/munge/run
touch "$BASE/.diffsweep-slurm"   # marker: stop-cluster.sh PURGE=1 only wipes a dir carrying it
if [ ! -s "$MUNGE_KEY" ]; then
  mungekey --create --keyfile="$MUNGE_KEY" >/dev/null
  chmod 0600 "$MUNGE_KEY"
fi

# ---------------------------------------------------------------- node sizing
hw=$(env -u SLURM_CONF slurmd -C 2>/dev/null | head -n 1) || true
case "$hw" in NodeName=*) ;; *) die "slurmd -C failed: $hw" ;; esac
hw_field() { sed -nE "s/.*[[:space:]]$1=([0-9]+).*/\1/p" <<<"$hw"; }
HW_CPUS=$(hw_field CPUs)
HW_MEM=$(hw_field RealMemory)
CPUS=${CPUS:-$(nproc)}
case "$CPUS" in ''|*[!0-9]*|0) die "CPUS must be a positive number" ;; esac
MEM=$(( HW_MEM * 9 / 10 ))
[ "$MEM" -ge 1 ] || MEM=1
OVERRIDES=""
if [ "$CPUS" = "$HW_CPUS" ]; then
  # keep the detected topology (sockets/cores/threads), as slurmd will report it
  TOPO=$(grep -oE '(CPUs|Boards|SocketsPerBoard|CoresPerSocket|ThreadsPerCore)=[0-9]+' <<<"$hw" | tr '\n' ' ')
  TOPO=${TOPO% }
else
  TOPO="CPUs=$CPUS Boards=1 SocketsPerBoard=1 CoresPerSocket=$CPUS ThreadsPerCore=1"
  if [ "$CPUS" -gt "$HW_CPUS" ]; then OVERRIDES="SlurmdParameters=config_overrides"; fi
fi

# ---------------------------------------------------------------- generated config
NEW="$BASE/etc/.new"
rm -rf "$NEW"; mkdir -p "$NEW"

if [ "$WITH_DBD" = 1 ]; then
  ACCT="AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=6819
# the dbd connection uses AccountingStoragePass as its munge socket, NOT AuthInfo:
AccountingStoragePass=$MUNGE_SOCK
JobAcctGatherType=jobacct_gather/linux"
else
  ACCT="AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none"
fi
if [ "$FAKE_GPUS" -gt 0 ]; then
  GRES_LINE="GresTypes=gpu"; NODE_GRES=" Gres=gpu:$FAKE_GPUS"
else
  GRES_LINE="# no fake GPUs (FAKE_GPUS=0)"; NODE_GRES=""
fi

cat >"$NEW/slurm.conf" <<EOF
# Generated by diffsweep slurm/start-cluster.sh; edits are overwritten.
ClusterName=ci
SlurmctldHost=$HOST(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire is also how long a requeued job waits before it may start again (default 120 s)
AuthInfo=socket=$MUNGE_SOCK,cred_expire=10
StateSaveLocation=$BASE/state/ctld
SlurmdSpoolDir=$BASE/state/d
SlurmctldPidFile=$BASE/run/slurmctld.pid
SlurmdPidFile=$BASE/run/slurmd.pid
SlurmctldLogFile=$BASE/log/slurmctld.log
SlurmdLogFile=$BASE/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
# no cgroups / no systemd
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
$ACCT
JobCompType=jobcomp/none
MailProg=/bin/true
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# fast turnaround for CI (defaults: batch_sched_delay=3, sched_interval=60, bf_interval=30)
SchedulerParameters=batch_sched_delay=0,sched_interval=1,bf_interval=1
KillWait=5
MinJobAge=600
MaxArraySize=1001
ReturnToService=2
$GRES_LINE
${OVERRIDES:-# CPUs as detected (no config_overrides)}
NodeName=$HOST NodeAddr=127.0.0.1 $TOPO RealMemory=$MEM$NODE_GRES State=UNKNOWN
PartitionName=debug Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
EOF

if [ "$FAKE_GPUS" -gt 0 ]; then
  echo "NodeName=$HOST Name=gpu File=$BASE/fakegpu/nvidia[0-$((FAKE_GPUS - 1))]" >"$NEW/gres.conf"
else
  : >"$NEW/gres.conf"
fi

if [ "$WITH_DBD" = 1 ]; then
  cat >"$NEW/slurmdbd.conf" <<EOF
# Generated by diffsweep slurm/start-cluster.sh; edits are overwritten.
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCK
DbdHost=localhost
DbdPort=6819
SlurmUser=root
PidFile=$BASE/run/slurmdbd.pid
LogFile=$BASE/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=3307
StorageUser=slurm
StoragePass=slurm
StorageLoc=slurm_acct_db
EOF
  chmod 0600 "$NEW/slurmdbd.conf"
fi

changed=""   # names of config files whose content changed
for f in slurm.conf gres.conf slurmdbd.conf; do
  if [ -e "$NEW/$f" ]; then
    cmp -s "$NEW/$f" "$BASE/etc/$f" || { changed="$changed $f"; mv -f "$NEW/$f" "$BASE/etc/$f"; }
  elif [ -e "$BASE/etc/$f" ]; then
    changed="$changed $f"; rm -f "$BASE/etc/$f"
  fi
done
rm -rf "$NEW"
changed=${changed# }

# fake GPU devices: must be character devices, so symlinks to /dev/null
find "$BASE/fakegpu" -mindepth 1 -maxdepth 1 -name 'nvidia*' -delete
for ((i = 0; i < FAKE_GPUS; i++)); do ln -sfn /dev/null "$BASE/fakegpu/nvidia$i"; done

# env.sh (+ sacct shim without dbd)
if [ "$WITH_DBD" = 1 ]; then
  rm -f "$BASE/bin/sacct"
  PATH_LINE=""
else
  cat >"$BASE/bin/sacct" <<'EOF'
#!/bin/sh
# sacct shim (no slurmdbd): answers submitit's `sacct -j ...` from squeue; only knows jobs
# still in slurmctld memory (MinJobAge).
ids=""; while [ $# -gt 0 ]; do case "$1" in -j|--jobs) ids="$ids,$2"; shift 2;; -j*) ids="$ids,${1#-j}"; shift;; --jobs=*) ids="$ids,${1#--jobs=}"; shift;; *) shift;; esac; done
echo "JobID|State|NodeList"; [ -n "$ids" ] && squeue -h -t all -j "${ids#,}" -o "%i|%T|%N" 2>/dev/null; exit 0
EOF
  chmod 0755 "$BASE/bin/sacct"
  PATH_LINE="case \":\$PATH:\" in *\":$BASE/bin:\"*) ;; *) export PATH=\"$BASE/bin:\$PATH\" ;; esac"
fi
cat >"$BASE/env.sh.tmp" <<EOF
# Generated by diffsweep slurm/start-cluster.sh: source it to use the local cluster.
export SLURM_CONF="$SLURM_CONF"
$PATH_LINE
EOF
mv -f "$BASE/env.sh.tmp" "$BASE/env.sh"

# ---------------------------------------------------------------- daemons
PF_MUNGE="$BASE/munge/run/munged.pid"
PF_MYSQL="$BASE/mysql/run/mariadbd.pid"
PF_DBD="$BASE/run/slurmdbd.pid"
PF_CTLD="$BASE/run/slurmctld.pid"
PF_SLURMD="$BASE/run/slurmd.pid"

# A changed config restarts the daemons that read it (cred_expire etc. need a real restart;
# `scontrol reconfigure` does not apply everything).
case "$changed" in *slurm.conf*|*gres.conf*)
  if running "$PF_SLURMD" slurmd || running "$PF_CTLD" slurmctld; then
    say "config changed ($changed): restarting slurmctld/slurmd"
  fi
  stop_daemon slurmd "$PF_SLURMD" slurmd
  stop_daemon slurmctld "$PF_CTLD" slurmctld ;;
esac
case "$changed" in *slurmdbd.conf*)
  if running "$PF_DBD" slurmdbd; then say "slurmdbd.conf changed: restarting slurmdbd"; fi
  stop_daemon slurmdbd "$PF_DBD" slurmdbd ;;
esac
if [ "$WITH_DBD" = 0 ]; then   # switched from dbd to no-dbd
  stop_daemon slurmdbd "$PF_DBD" slurmdbd
  stop_daemon mariadbd "$PF_MYSQL" mariadbd
fi

# preflight: the ports are fixed, so fail fast if something else holds one we still need
if [ "$WITH_DBD" = 1 ]; then
  running "$PF_MYSQL" mariadbd || check_port 3307 mariadbd
  running "$PF_DBD" slurmdbd || check_port 6819 slurmdbd
fi
running "$PF_CTLD" slurmctld || check_port 6817 slurmctld
running "$PF_SLURMD" slurmd || check_port 6818 slurmd

if running "$PF_MUNGE" munged; then
  :
else
  say "starting munged"
  rm -f "$MUNGE_SOCK" "$MUNGE_SOCK.lock"
  munged --key-file="$MUNGE_KEY" --socket="$MUNGE_SOCK" --pid-file="$PF_MUNGE" \
    --log-file="$BASE/munge/log/munged.log" --seed-file="$BASE/munge/lib/munged.seed" \
    </dev/null >>"$BASE/log/start.log" 2>&1 || fail "munged failed to start"
  wait_for 10 "munge socket" test -S "$MUNGE_SOCK"
fi

if [ "$WITH_DBD" = 1 ]; then
  mkdir -p "$BASE/mysql/run"
  if ! running "$PF_MYSQL" mariadbd; then
    if [ ! -d "$BASE/mysql/data/mysql" ]; then
      say "initialising MariaDB data dir"
      rm -rf "$BASE/mysql/data"
      mariadb-install-db --no-defaults --datadir="$BASE/mysql/data" --user=root --skip-test-db \
        >>"$BASE/log/mariadb-install.log" 2>&1 || fail "mariadb-install-db failed (see $BASE/log/mariadb-install.log)"
    fi
    say "starting mariadbd (127.0.0.1:3307)"
    rm -f "$MYSQL_SOCK"
    setsid mariadbd --no-defaults --datadir="$BASE/mysql/data" --socket="$MYSQL_SOCK" --port=3307 \
      --bind-address=127.0.0.1 --pid-file="$PF_MYSQL" --user=root --log-error="$BASE/log/mariadbd.log" \
      --skip-name-resolve --innodb-buffer-pool-size=128M --innodb-log-file-size=64M \
      --innodb-lock-wait-timeout=900 </dev/null >>"$BASE/log/mariadbd.log" 2>&1 &
    mpid=$!; end=$(( $(date +%s) + 30 ))
    until mariadb --no-defaults -S "$MYSQL_SOCK" -e 'SELECT 1' >/dev/null 2>&1; do
      kill -0 "$mpid" 2>/dev/null || fail "mariadbd exited during startup"
      [ "$(date +%s)" -lt "$end" ] || fail "timed out after 30s waiting for mariadbd"
      sleep 0.2
    done
    mariadb --no-defaults -S "$MYSQL_SOCK" -e "CREATE USER IF NOT EXISTS 'slurm'@'%' IDENTIFIED BY 'slurm'; GRANT ALL ON slurm_acct_db.* TO 'slurm'@'%';" \
      || fail "could not create the slurm DB user"
  fi
  if ! running "$PF_DBD" slurmdbd; then
    say "starting slurmdbd"
    slurmdbd </dev/null >>"$BASE/log/start.log" 2>&1 || fail "slurmdbd failed to start"
    wait_for 30 "slurmdbd" sacctmgr -n -i show cluster
  fi
fi

if ! running "$PF_CTLD" slurmctld; then
  say "starting slurmctld"
  slurmctld </dev/null >>"$BASE/log/start.log" 2>&1 || fail "slurmctld failed to start"
fi
if ! running "$PF_SLURMD" slurmd; then
  say "starting slurmd"
  slurmd </dev/null >>"$BASE/log/start.log" 2>&1 || fail "slurmd failed to start"
fi

# ---------------------------------------------------------------- wait until usable
node_state() { sinfo -h -n "$HOST" -o %t 2>/dev/null | head -n 1; }
node_ready() { case "$(node_state)" in idle|mix|alloc|comp) return 0 ;; *) return 1 ;; esac; }
end=$(( $(date +%s) + 60 )); resumed=0
until node_ready; do
  st=$(node_state)
  case "$st" in
    drain*|drng*|down*) # e.g. left drained by an earlier run: try to resume once
      if [ "$resumed" = 0 ]; then
        say "node is '$st': resuming it"
        scontrol update NodeName="$HOST" State=RESUME >/dev/null 2>&1 || true
        resumed=1
      fi ;;
  esac
  [ "$(date +%s)" -lt "$end" ] || fail "node $HOST not idle after 60 s (sinfo state: '${st:-none}'; $(scontrol show node "$HOST" 2>/dev/null | grep -o 'Reason=.*' || true))"
  sleep 0.2
done
if [ "$WITH_DBD" = 1 ]; then
  wait_for 60 "cluster 'ci' registered in slurmdbd" \
    bash -c 'sacctmgr -n -P show cluster format=cluster | grep -qx ci'
  wait_for 30 "sacct" sacct -n -X
fi

say "cluster up in $(elapsed) s: node $HOST $(node_state), $CPUS CPUs, $FAKE_GPUS fake GPUs, dbd=$WITH_DBD"
say "use it with: source $BASE/env.sh"
