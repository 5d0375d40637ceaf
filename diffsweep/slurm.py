"""The Slurm client: every Slurm command diffsweep runs (``sinfo``, ``squeue``, ``sacct``,
``scancel``, ``scontrol``, ``sacctmgr``; submitit runs ``sbatch``) and the one vocabulary of job
states. Nothing else in diffsweep runs a Slurm command or spells a Slurm state.

It sits low (beside ``diffsweep.lockfile``, which asks it whether a lock's Slurm job still runs)
and imports only ``diffsweep.config``: no torch, no submitit.

Two things submitit cannot answer, so they are asked of Slurm here:

- States (``states``): ``submitit.Job.state`` reads only ``sacct``, which answers nothing without
  accounting (slurmdbd) and never says why a job waits. ``squeue -r -t all`` knows every job
  slurmctld still holds, with its reason (``PENDING (Resources)``); sacct then covers the jobs
  slurmctld has forgotten.
- Cancelling (``cancel``): ``Job.cancel()`` runs one scancel per job and trusts its exit status;
  one scancel for a whole sweep's array tasks is one call, and its exit status is not the answer
  (it can fail although the jobs were signalled), so Slurm is asked afterwards.
"""

from __future__ import annotations

import shutil
import subprocess
import time

from diffsweep.config import ConfigError, EnvironmentUnavailable

# --- the vocabulary: Slurm job states (squeue %T, sacct State) ------------------------------------
# A job in one of these waits to run (squeue's %r says why).
WAITING = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "SPECIAL_EXIT"})
# ... runs, or is held while it runs.
EXECUTING = frozenset({"RUNNING", "CONFIGURING", "RESIZING", "SUSPENDED", "STOPPED"})
# ... is ending: scancel has reached it (or it finished) and its processes may still be saving.
ENDING = frozenset({"COMPLETING", "SIGNALING", "STAGE_OUT"})
# A job in any of these still exists and its processes may still run: nothing may start in its place.
LIVE = WAITING | EXECUTING | ENDING
# What scancel must have moved a job out of for it to count as stopped.
NOT_STOPPED = WAITING | EXECUTING
# Ended by someone, not by itself (diffsweep ends such a run's MLflow run as KILLED, others as FAILED).
KILLED = frozenset({"CANCELLED", "PREEMPTED", "REVOKED"})

CLIENT_TOOLS = ("sbatch", "squeue", "scancel", "sinfo")  # what launching a sweep on Slurm needs
DEFAULT_ARRAY_SIZE = 1001  # Slurm's default MaxArraySize


def word(state: str) -> str:
    """The state's word without a reason: ``PENDING`` of ``PENDING (Resources)``."""
    return state.split(" ", 1)[0]


# --- the controller and the cluster --------------------------------------------------------------
def answers(timeout: float = 10) -> bool:
    """Whether a Slurm controller answers here (``sinfo``)."""
    if shutil.which("sinfo") is None:
        return False
    try:
        return subprocess.run(["sinfo", "-h", "-o", "%P"], capture_output=True, timeout=timeout).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def check_controller() -> None:
    """The client tools are on PATH and the controller answers; else a ``ConfigError`` on
    ``executor`` saying which and what to do."""
    for tool in CLIENT_TOOLS:
        if shutil.which(tool) is None:
            raise ConfigError("executor", f"slurm: {tool} is not on PATH (no Slurm client here); use --executor "
                              "local, or run where Slurm is installed")
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%P"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        raise ConfigError("executor", f"slurm: sinfo failed ({exc})") from None
    if out.returncode != 0:
        first = (out.stderr.strip().splitlines() or ["no output"])[0]
        raise ConfigError("executor", f"slurm: cannot reach the Slurm controller ({first}); is SLURM_CONF set?")


def partitions() -> dict[str, list[str]]:
    """Each partition's node GRES strings (``sinfo %G``: ``gpu:2``, ``gpu:h100:8(S:0-1)``,
    ``(null)``); the default partition also as ``""``. Empty if sinfo does not answer."""
    found: dict[str, list[str]] = {}
    for line in (_ask(["sinfo", "-h", "-o", "%P|%G"]) or "").splitlines():
        name, _, gres = line.strip().partition("|")
        if not name:
            continue
        for key in (name.rstrip("*"), "") if name.endswith("*") else (name,):
            found.setdefault(key, []).append(gres.strip())
    return found


def node_features(partition: str) -> set[str]:
    """The features (``sinfo %f``) of the partition's nodes (the default partition's for ``""``);
    empty if sinfo does not answer."""
    out = _ask(["sinfo", "-h", "-o", "%f"] + (["-p", partition] if partition else [])) or ""
    return {f for line in out.split() for f in line.split(",") if f and f != "(null)"}


def associations(user: str) -> list[tuple[str, str]]:
    """(account, comma-separated QoS) of each of ``user``'s associations (``sacctmgr``); empty
    without accounting or when it does not answer."""
    out = _ask(["sacctmgr", "-n", "-P", "show", "assoc", f"user={user}", "format=account,qos"]) or ""
    return [(a, q) for a, q in (line.split("|")[:2] for line in out.splitlines() if "|" in line)]


def accounting() -> str:
    """Why ``sacct`` does not answer (slurmdbd is not running), or "" when it does."""
    try:
        out = subprocess.run(["sacct", "-n", "-P", "-X", "--format=JobID", "-j", "1"], capture_output=True,
                             text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        return str(exc) or type(exc).__name__
    if out.returncode == 0:
        return ""
    return (out.stderr.strip().splitlines() or [f"exit {out.returncode}"])[0]


def max_array_size() -> int:
    """The cluster's MaxArraySize (``scontrol show config``), else Slurm's default."""
    for line in (_ask(["scontrol", "show", "config"]) or "").splitlines():
        if line.split("=")[0].strip() == "MaxArraySize":
            try:
                return int(line.split("=", 1)[1].strip())
            except ValueError:
                break
    return DEFAULT_ARRAY_SIZE


# --- jobs ----------------------------------------------------------------------------------------
def states(job_ids: list[str]) -> dict[str, str]:
    """Slurm states by job id (``123`` or ``123_4``): squeue for jobs slurmctld still holds,
    sacct for the rest; a waiting job's state carries squeue's reason: ``PENDING (Resources)``.
    Ids neither knows are left out. If squeue itself fails, nothing can be told apart (a pending
    job would look lost), so that is an ``EnvironmentUnavailable``, not a guess."""
    wanted = set(job_ids)
    found: dict[str, str] = {}
    if not wanted:
        return found
    for line in _must(["squeue", "-h", "-r", "-t", "all", "-o", "%i|%T|%r"]).splitlines():
        jid, state, reason = (line.split("|") + ["", ""])[:3]
        if jid in wanted:
            found[jid] = state.strip()
            if state.strip() in WAITING and reason.strip() not in ("", "None"):
                found[jid] += f" ({reason.strip()})"  # Resources, Priority, BeginTime, JobArrayTaskLimit, ...
    missing = sorted(wanted - found.keys())
    if missing:
        try:  # sacct fails without accounting; jobs slurmctld forgot then stay unknown
            out = _must(["sacct", "-n", "-P", "-X", "--format=JobID,State", "-j", ",".join(missing)])
        except EnvironmentUnavailable:
            out = ""
        for line in out.splitlines():
            jid, _, state = line.partition("|")
            if jid in wanted and state.strip():
                found[jid] = word(state)
    return found


def job_ended(job: str) -> bool:
    """Whether Slurm says ``job`` no longer runs (``diffsweep.lockfile``: is a lock's holder
    gone?); False when Slurm cannot be asked."""
    try:
        out = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return False
    if out.returncode != 0:
        return "invalid job id" in out.stderr.lower()  # long gone from the controller
    return not any(s in LIVE for s in out.stdout.split())


def cancel(job_ids: list[str], wait_s: float = 15.0) -> tuple[dict[str, str], str]:
    """Cancel Slurm jobs. Returns those Slurm still shows waiting or running (``NOT_STOPPED``),
    with their states, and what scancel said. Its exit status is not the answer: it can fail
    although the jobs were signalled, and fails for a job that ended meanwhile; so on failure
    Slurm is asked, for up to ``wait_s`` (a job takes a moment to stop)."""
    out = subprocess.run(["scancel", *job_ids], capture_output=True, text=True, timeout=60)
    if out.returncode == 0:
        return {}, ""
    said = (out.stderr.strip().splitlines() or [f"scancel exited {out.returncode}"])[0]
    deadline = time.monotonic() + wait_s
    while True:
        now = states(job_ids)  # a job Slurm no longer knows has stopped
        live = {j: now[j] for j in job_ids if j in now and word(now[j]) in NOT_STOPPED}
        if not live or time.monotonic() > deadline:
            return live, said
        time.sleep(1)


def release(job_ids: list[str]) -> str:
    """``scontrol release``: let held jobs start. Returns what scontrol said when it failed ("" if
    it did not; a job released already or gone is no failure of the release)."""
    try:
        out = subprocess.run(["scontrol", "release", *job_ids], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"scontrol release failed ({exc})"
    said = [line for line in out.stderr.strip().splitlines()
            if line.strip() and "not held" not in line.lower() and "already completed" not in line.lower()
            and "invalid job id" not in line.lower()]
    return f"scontrol release: {said[0]}" if out.returncode != 0 and said else ""


def sbatch_error(exc: BaseException) -> str:
    """What sbatch said when it refused a job (submitit raises with its whole output): the line
    that names the error, else the first."""
    text = str(exc).strip()
    for line in text.splitlines():
        if "error" in line.lower():
            return line.strip()
    return (text.splitlines() or [type(exc).__name__])[0][:300]


def cancel_quietly(job_id: str) -> None:
    """scancel ``job_id``, whatever becomes of it (the doctor's probe jobs on a failed check)."""
    try:
        subprocess.run(["scancel", job_id], capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        pass


def send_signal(job_id: str, signal: str) -> None:
    """Send ``signal`` (``USR2``: what Slurm sends before preempting) to the job's processes."""
    subprocess.run(["scancel", f"--signal={signal}", job_id], check=False, capture_output=True, timeout=60)


def _ask(argv: list[str]) -> str | None:
    """The command's stdout, or None if it is missing, fails or hangs (what asked it then skips)."""
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def _must(argv: list[str]) -> str:
    """The command's stdout; ``EnvironmentUnavailable`` if it fails (job states cannot be told)."""
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        raise EnvironmentUnavailable(f"{argv[0]} failed ({exc}); cannot tell the sweep's job states") from None
    if out.returncode != 0:
        first = (out.stderr.strip().splitlines() or [f"exit {out.returncode}"])[0]
        raise EnvironmentUnavailable(f"{argv[0]} failed ({first}); cannot tell the sweep's job states")
    return out.stdout
