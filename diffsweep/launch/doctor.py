"""``diffsweep doctor``: a self-test of the cluster and the configuration a launch would use.

Each check is one function returning a ``Check`` (ok, what it found, and on failure the fix);
``run_doctor`` runs them in order and stops where later checks cannot run (no controller, no
partition). On a Slurm profile it checks:

- the controller answers (``sinfo``) and accounting answers (``sacct``: submitit reads job states
  with it, and waits forever on a job that died without it);
- the profile's partition exists, its nodes have the profile's GPUs per node, of the profile's
  GPU type where the GRES names types, and its ``constraint`` is a node feature;
- a 1-task and a 2-task job start (within ``timeout_s``; else the pending reason), see the GPUs
  they asked for (``CUDA_VISIBLE_DEVICES`` from Slurm, and CUDA devices in torch), and the two
  tasks all-reduce (NCCL when both see a GPU, else gloo);
- the run directory is on a file system the compute nodes share (a token written here is read in
  the job, and one written in the job is read here);
- the MLflow store (``MLFLOW_TRACKING_URI``, else ./mlflow.db) is usable here and takes a metric
  written *from the compute node*, read back here;
- with ``preempt``: a tiny training job (``diffsweep.launch.doctor_preempt``) gets USR2 as on
  preemption, checkpoints, is requeued by Slurm and resumes the same MLflow run with every step
  logged once.

Doctor's jobs write under ``<out>/.doctor/<stamp>/`` (removed when every check passes) and its
MLflow runs go to the experiment ``diffsweep-doctor`` (deleted once read back). Every job it
submits goes through ``submit``; interrupted (Ctrl-C), ``run_doctor`` cancels those Slurm still
holds and raises ``DoctorInterrupted`` naming them.

The checks of a scheduler are its entry in ``SUITES``; a scheduler without one (``local``: jobs
run on this machine) gets the run directory and store checks, from here.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from diffsweep import slurm
from diffsweep.config import ConfigError
from diffsweep.launch import cluster, doctor_probe
from diffsweep.launch.doctor_jobs import (
    Check,
    cancel_submitted,
    doctor_executor,
    doctor_resources,
    forget_submitted,
    submit,
)
from diffsweep.launch.doctor_probe import METRIC
from diffsweep.launch.profiles import Profile


@dataclass
class DoctorReport:
    """Every check that ran, in order; ``workdir``: where the jobs' files are (kept on failure)."""

    profile: str
    executor: str
    checks: list[Check] = field(default_factory=list)
    workdir: str | None = None

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)

    def to_dict(self) -> dict[str, Any]:
        return {"profile": self.profile, "executor": self.executor, "ok": self.ok, "workdir": self.workdir,
                "checks": [asdict(c) for c in self.checks]}


class DoctorInterrupted(KeyboardInterrupt):
    """Ctrl-C during ``run_doctor``, raised once the jobs it had submitted are cancelled:
    ``cancelled``, those Slurm still held; ``problem``, what went wrong cancelling them, if anything."""

    def __init__(self, cancelled: list[str], problem: str = "") -> None:
        super().__init__(cancelled, problem)
        self.cancelled = cancelled
        self.problem = problem


@contextlib.contextmanager
def _sigint_ignored() -> Iterator[None]:
    """A second Ctrl-C neither stops this block nor the commands it runs (they inherit SIG_IGN)."""
    try:
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:  # not the main thread, where Ctrl-C does not arrive anyway
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous if previous is not None else signal.SIG_DFL)


def doctor_profile(profile: str | None, executor: str | None, slurm_overrides: list[str],
                   setup_lines: list[str]) -> Profile:
    """The profile doctor checks: ``--profile``, else ``--executor``'s default one, else the scheduler
    that answers here if it has cluster checks (Slurm), else Slurm's default profile (whose first
    check then says that no controller answers, and how to fix it); with ``--slurm`` and
    ``--setup`` applied as ``launch`` applies them."""
    from diffsweep.launch.profiles import pick_profile, with_overrides
    from diffsweep.launch.scheduler import detect_scheduler, get_scheduler

    if profile is None and executor is None:
        found = detect_scheduler()
        chosen = found.default_profile() if found.name in SUITES else get_scheduler(next(iter(SUITES))).default_profile()
    else:
        chosen = pick_profile(profile, executor)
    return with_overrides(chosen, slurm_overrides, setup_lines)


def run_doctor(profile: Profile, out: Path, *, preempt: bool = False, timeout_s: float = 120.0,
               echo: Callable[[Check], None] = lambda c: None) -> DoctorReport:
    """Run the checks of ``profile`` (``echo`` gets each as it completes). ``out``: the runs
    directory whose file system is checked (doctor's files go under ``out/.doctor``). On Ctrl-C,
    the jobs it submitted are cancelled and ``DoctorInterrupted`` raised (its files are kept)."""
    check_doctor_options(out, timeout_s)
    report = DoctorReport(profile=profile.name, executor=profile.executor)

    def add(check: Check) -> bool:
        report.checks.append(check)
        echo(check)
        return check.ok

    suite = SUITES.get(profile.executor)
    created = [p for p in (out.absolute(), *out.absolute().parents) if not p.exists()]  # deepest first
    work = _workdir(out, add)
    if work is None:
        return report
    report.workdir = str(work)
    if suite is None:  # e.g. local: jobs run on this machine, as this process does
        from diffsweep.launch.scheduler import get_scheduler

        where = get_scheduler(profile.executor).runs_jobs
        add(Check("jobs", True, f"executor {profile.executor} runs jobs {where}: doctor has no checks of its jobs"))
        add(check_store_here())
    else:
        forget_submitted()
        try:
            suite(profile, work, add, preempt=preempt, timeout_s=timeout_s)
        except KeyboardInterrupt:
            with _sigint_ignored():
                cancelled, problem = cancel_submitted()
                if not any(work.iterdir()):  # else kept, as on failure
                    _remove_workdir(work, created)
            raise DoctorInterrupted(cancelled, problem) from None
    if report.ok or not any(work.iterdir()):  # kept when a job's logs may say why it failed
        _remove_workdir(work, created)
        report.workdir = None
    return report


def _remove_workdir(work: Path, created: list[Path]) -> None:
    """Remove doctor's own folder, then ``.doctor`` and the folders doctor made above it (``created``,
    deepest first) while they are empty: a passing doctor leaves the runs directory as it found it."""
    shutil.rmtree(work, ignore_errors=True)
    for folder in [work.parent, *created]:
        try:
            folder.rmdir()  # .doctor, unless another doctor run is using it
        except FileNotFoundError:
            continue
        except OSError:
            return


def check_doctor_options(out: Path, timeout_s: float) -> None:
    """``--out`` a folder (or a path where one can be made: no file on the way) and ``--timeout`` a
    finite number of seconds >= 1 (``not (x >= 1)`` also refuses NaN), before anything is created."""
    if not (1.0 <= timeout_s < float("inf")):
        raise ConfigError("timeout_s", f"expected a finite number of seconds >= 1, got {timeout_s}")
    blocking = next((p for p in (out.absolute(), *out.absolute().parents) if p.exists()), None)
    if blocking is not None and not blocking.is_dir():
        where = "is not a directory" if blocking == out.absolute() else f"lies under {blocking}, which is not one"
        raise ConfigError("out", f"{out} {where}; expected a runs directory")


def slurm_suite(profile: Profile, work: Path, add: Callable[[Check], bool], *, preempt: bool,
                timeout_s: float) -> None:
    """The checks of a Slurm profile, in order; stops where later ones cannot run."""
    if not add(check_controller()):
        return
    add(check_accounting())
    if not add(check_partition(profile)):
        return
    add(check_gpu_type(profile))
    uri_ok = add(check_store_here())
    for check in check_jobs(profile, work, timeout_s=timeout_s, mlflow=uri_ok):
        add(check)
    if preempt:
        from diffsweep.launch.doctor_preempt import check_preemption

        add(check_preemption(profile, work, timeout_s=max(timeout_s, 300.0)))


# The cluster checks of each scheduler, by name; one without any (local) gets the store check only.
SUITES: dict[str, Callable[..., None]] = {"slurm": slurm_suite}


# --- the controller, accounting and the partition ---------------------------------------------------


def check_controller() -> Check:
    """The Slurm client tools are here and the controller answers."""
    try:
        slurm.check_controller()
    except ConfigError as exc:
        problem, _, fix = exc.message.removeprefix("slurm: ").partition("; ")
        return Check("slurm", False, problem, fix or "start the Slurm controller, or run doctor where Slurm answers")
    names = sorted(p for p in slurm.partitions() if p)
    return Check("slurm", True, f"the controller answers (partitions: {', '.join(names) or 'none'})")


def check_accounting() -> Check:
    """``sacct`` answers: submitit reads job states with it."""
    said = slurm.accounting()
    if not said:
        return Check("accounting", True, "sacct answers")
    return Check("accounting", False, f"sacct does not answer ({said})",
                 "run slurmdbd (AccountingStorageType=accounting_storage/slurmdbd in slurm.conf): submitit reads job "
                 "states with sacct, and without it waits forever on a job that died without a result")


def check_partition(profile: Profile) -> Check:
    """The profile's partition (or the cluster's default one) exists."""
    found = slurm.partitions()
    wanted = profile.executor_params.get("partition")
    known = sorted(p for p in found if p)
    if wanted is None:
        if "" not in found:
            return Check("partition", False, "the profile names no partition and the cluster has no default one",
                         f"set slurm.partition in profile {profile.name} to one of [{', '.join(known)}]")
        return Check("partition", True, "the cluster's default partition (the profile names none)")
    try:
        cluster.check_partition(profile)
    except ConfigError as exc:
        return Check("partition", False, f"{exc.key}: {exc.message}",
                     f"set slurm.partition in profile {profile.name} to a partition of this cluster "
                     f"([{', '.join(known)}]), or pass --slurm partition=NAME")
    return Check("partition", True, f"{wanted} exists")


def check_gpu_type(profile: Profile) -> Check:
    """The partition's nodes have the profile's GPUs per node, of its GPU type where the GRES names
    types, and the profile's ``constraint`` is one of their features."""
    wanted = str(profile.executor_params.get("partition") or "")
    where = f"partition {wanted}" if wanted else "the default partition"
    gres = slurm.partitions().get(wanted) or []
    most = max((cluster.gpus_per_node(g) for g in gres), default=0)
    if profile.gpus_per_node > most:
        return Check("gpus", False, f"profile {profile.name} has {profile.gpus_per_node} GPUs per node, but the nodes "
                     f"of {where} have at most {most} (sinfo GRES: {', '.join(sorted(set(gres))) or 'none'})",
                     f"set gpus_per_node: {most} in profile {profile.name}, or pick a partition with GPUs")
    types = sorted({t for g in gres for t in _gpu_types(g)})
    name = profile.gpu.name.lower()
    if profile.gpus_per_node and types and not any(name in t.lower() or t.lower() in name for t in types):
        return Check("gpus", False, f"profile {profile.name}'s GPU {profile.gpu.name!r} is not a GPU type of {where} "
                     f"([{', '.join(types)}])", f"set gpu.name (and memory_gb, peak_tflops) in profile "
                     f"{profile.name} to the partition's GPU, or pick its partition")
    constraint = profile.executor_params.get("constraint")
    if constraint is not None:
        features = slurm.node_features(wanted)
        missing = [f for f in _constraint_features(str(constraint)) if features and f not in features]
        if missing:
            return Check("gpus", False, f"constraint {constraint!r}: {', '.join(missing)} is no feature of the nodes of "
                         f"{where} ([{', '.join(sorted(features))}])",
                         f"set slurm.constraint in profile {profile.name} to node features (sinfo -o %f)")
    kind = f" {profile.gpu.name}" if types else ""
    return Check("gpus", True, f"{where} has nodes with {most}{kind} GPUs; the profile uses {profile.gpus_per_node}"
                 + (f" (types: {', '.join(types)})" if types else ""))


def _gpu_types(gres: str) -> list[str]:
    """``gpu:h100:8(S:0-1),gpu:a100:2`` -> [h100, a100]; an untyped ``gpu:2`` has none."""
    found = []
    for item in gres.split(","):
        parts = item.split("(")[0].split(":")
        if parts[0] == "gpu" and len(parts) == 3:
            found.append(parts[1])
    return found


def _constraint_features(constraint: str) -> list[str]:
    """The feature names of a constraint expression (``h100&ib``, ``[a100|h100]``, ``h100*2``)."""
    for sep in "&|[]()!":
        constraint = constraint.replace(sep, " ")
    return [w.split("*")[0] for w in constraint.split() if w.split("*")[0]]


# --- the store and the run directory, from here -----------------------------------------------------


def check_store_here() -> Check:
    """The MLflow store a launch would use is usable from this machine."""
    from diffsweep.tracking.store import check_tracking, shown, tracking_uri

    uri = tracking_uri()
    try:
        check_tracking(uri)
    except ConfigError as exc:
        return Check("mlflow", False, f"{shown(uri)}: {exc.message}",
                     "set MLFLOW_TRACKING_URI to a store every node reaches (sqlite:///<shared dir>/mlflow.db, "
                     "or an MLflow server's http(s):// address)")
    return Check("mlflow", True, f"{shown(uri)} is usable from this machine")


def _workdir(out: Path, add: Callable[[Check], bool]) -> Path | None:
    work = out.absolute() / ".doctor" / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    try:
        work.mkdir(parents=True)
        probe = work / "write.test"
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        add(Check("run directory", False, f"cannot write under {out.absolute()} ({exc.strerror or exc})",
                  "pass --out DIR with a writable directory (on a file system every node shares)"))
        return None
    return work


# --- jobs -------------------------------------------------------------------------------------------


def check_jobs(profile: Profile, work: Path, *, timeout_s: float, mlflow: bool) -> list[Check]:
    """Submit the 1-task and the 2-task probe jobs together; check what they report."""
    from diffsweep.tracking.store import tracking_uri

    token = secrets.token_hex(8)
    (work / "login.token").write_text(token)
    uri = tracking_uri() if mlflow else None
    one_gpu, two_gpus = min(1, profile.gpus_per_node), min(2, profile.gpus_per_node)
    jobs = {}
    for tasks, gpus in ((1, one_gpu), (2, two_gpus)):
        executor = doctor_executor(profile, work / f"jobs-{tasks}", doctor_resources(profile, tasks, gpus),
                                   f"diffsweep-doctor-{tasks}")
        try:
            jobs[tasks] = (submit(executor, doctor_probe.probe, str(work), token, uri if tasks == 1 else None),
                           time.monotonic())
        except Exception as exc:  # noqa: BLE001 (sbatch refused: limits, account, memory)
            for job, _ in jobs.values():  # the 1-task job, if only the 2-task one was refused
                slurm.cancel_quietly(job.job_id)
            return [Check(f"{tasks}-task job", False, f"sbatch refused it: {slurm.sbatch_error(exc)}",
                          f"fix profile {profile.name}'s slurm: settings (account, qos, partition limits) so sbatch "
                          "accepts its jobs")]
    reports: dict[int, list[dict] | None] = {}
    checks = []
    for tasks, (job, started) in jobs.items():
        check, reports[tasks] = _wait(job, tasks, started, timeout_s, work)
        checks.append(check)
    done = [r for rs in reports.values() if rs for r in rs]
    if done:
        checks.append(_check_shared_fs(done, work))
        checks.append(_check_gpus(reports, one_gpu, two_gpus, profile))
    if reports.get(2):
        checks.append(_check_all_reduce(reports[2]))
    if uri is not None and reports.get(1):
        checks.append(_check_store_from_node(reports[1][0], uri))
    return checks


def _wait(job: Any, tasks: int, started: float, timeout_s: float, work: Path) -> tuple[Check, list[dict] | None]:
    """Wait for ``job`` to end (``timeout_s`` from its submission): a Check and the tasks' reports."""
    from diffsweep.config import EnvironmentUnavailable

    name = f"{tasks}-task job"
    state = ""
    while time.monotonic() - started < timeout_s:
        try:
            state = slurm.states([job.job_id]).get(job.job_id, state)
        except EnvironmentUnavailable:
            pass
        if state and slurm.word(state) not in slurm.LIVE:  # ended
            break
        time.sleep(0.5)
    else:
        slurm.cancel_quietly(job.job_id)
        pending = state.startswith("PENDING")
        return Check(name, False, f"job {job.job_id} {'did not start' if pending else 'did not end'} within "
                     f"{timeout_s:.0f} s ({state or 'state unknown'}; cancelled)",
                     "see why with `squeue -j ID -o %r` (Resources: the partition is full, wait or use another; "
                     "ReqNodeNotAvail/PartitionConfig: the job asks for more than a node has); or pass a longer "
                     "--timeout" if pending else "see its log in " + str(job.paths.folder)), None
    took = time.monotonic() - started
    if state.split(" ")[0] != "COMPLETED":
        return Check(name, False, f"job {job.job_id} ended {state}: {_log_tail(job)}",
                     f"read its log in {job.paths.folder}; if it is missing there, {work.parent.parent} is not on "
                     "a file system the compute nodes share (pass --out DIR on one)"), None
    try:
        results = job.results()
    except Exception as exc:  # noqa: BLE001 (the job ran, but its result is not here)
        return Check(name, False, f"job {job.job_id} completed, but its result is not readable here "
                     f"({type(exc).__name__})", f"{work.parent.parent} must be on a file system the compute nodes "
                     "share (pass --out DIR on one)"), None
    hosts = sorted({r["host"] for r in results})
    return Check(name, True, f"job {job.job_id} started and ran {tasks} task{'s' * (tasks > 1)} on "
                 f"{', '.join(hosts)} ({took:.0f} s from submission)"), results


def _log_tail(job: Any) -> str:
    for path in (job.paths.stderr, job.paths.stdout):
        try:
            lines = [ln for ln in Path(path).read_text().splitlines() if ln.strip()]
        except OSError:
            continue
        if lines:
            return lines[-1][:300]
    return "no log here"


def _check_shared_fs(reports: list[dict], work: Path) -> Check:
    base = work.parent.parent
    if not all(r["saw_token"] for r in reports):
        return Check("shared file system", False, f"the job did not find the file this machine wrote in {work}",
                     "put the runs directory on a file system every node mounts at the same path (pass --out DIR)")
    missing = [r["host"] for r in reports if not (Path(r["wrote"]).is_file()
                                                  and Path(r["wrote"]).read_text() == r["token"])]
    if missing:
        return Check("shared file system", False, f"files the job wrote on {', '.join(missing)} are not seen here",
                     "put the runs directory on a file system every node mounts at the same path (pass --out DIR)")
    return Check("shared file system", True, f"{base} is seen alike here and on {', '.join(sorted({r['host'] for r in reports}))}")


def _check_gpus(reports: dict[int, list[dict] | None], one: int, two: int, profile: Profile) -> Check:
    seen = []
    for tasks, asked in ((1, one), (2, two)):
        for r in reports.get(tasks) or []:
            visible = [d for d in (r["cuda_visible_devices"] or "").split(",") if d]
            seen.append((tasks, asked, visible, r))
    if profile.gpus_per_node == 0:
        return Check("gpus in jobs", True, "the profile asks for no GPUs (CPU jobs)")
    for tasks, asked, visible, r in seen:
        if len(visible) < asked:
            return Check("gpus in jobs", False, f"the {tasks}-task job asked for {asked} GPUs, but Slurm set "
                         f"CUDA_VISIBLE_DEVICES={r['cuda_visible_devices']!r} on {r['host']}",
                         "the nodes' gres.conf must name the GPU device files (File=/dev/nvidia[0-7]) so "
                         "Slurm hands jobs their GPUs")
        if r["cuda_devices"] < asked:
            build = "a CPU-only build" if not r["torch_cuda"] else f"built for CUDA {r['torch_cuda']}"
            return Check("gpus in jobs", False, f"Slurm gave the {tasks}-task job GPUs {','.join(visible)} on "
                         f"{r['host']}, but torch {r['torch']} ({build}) sees {r['cuda_devices']} CUDA devices there",
                         "install a CUDA build of torch for the nodes' driver, and load CUDA in the profile's "
                         "setup: lines (e.g. module load cuda)")
    return Check("gpus in jobs", True, "; ".join(f"{t}-task job: CUDA_VISIBLE_DEVICES={','.join(v)}, torch sees "
                                                 f"{r['cuda_devices']}" for t, _, v, r in seen[:2]))


def _check_all_reduce(reports: list[dict]) -> Check:
    errors = [r["all_reduce_error"] for r in reports if r.get("all_reduce_error")]
    backend = reports[0].get("backend", "?")
    expected = sum(range(1, len(reports) + 1))
    if errors or any(r.get("all_reduce") != expected for r in reports):
        return Check("all-reduce", False, f"{backend} all-reduce across {len(reports)} tasks failed: "
                     f"{errors[0] if errors else [r.get('all_reduce') for r in reports]}",
                     "the tasks must reach the first task's node on its MASTER_PORT; for NCCL add "
                     "`export NCCL_DEBUG=INFO` (and NCCL_SOCKET_IFNAME) to the profile's setup: lines and read "
                     "the job log")
    return Check("all-reduce", True, f"{backend} across {len(reports)} tasks: sum of ranks+1 = {expected} on every task")


def _check_store_from_node(report: dict, uri: str) -> Check:
    from diffsweep.tracking.store import shown

    if report.get("mlflow_error"):
        return Check("mlflow from a node", False, f"the job on {report['host']} could not write to {shown(uri)}: "
                     f"{report['mlflow_error']}", "set MLFLOW_TRACKING_URI to a store the compute nodes reach: an "
                     "SQLite file on a shared file system, or a server address they can connect to")
    from diffsweep.tracking.store import mlflow_client

    client = mlflow_client(uri)
    try:
        history = client.get_metric_history(report["mlflow_run_id"], METRIC)
        client.delete_run(report["mlflow_run_id"])
    except Exception as exc:  # noqa: BLE001 (the store answers differently here and there)
        return Check("mlflow from a node", False, f"run {report['mlflow_run_id']} written on {report['host']} is not "
                     f"readable here ({type(exc).__name__}: {exc})"[:400],
                     "compute nodes and this machine must reach the same store (one MLFLOW_TRACKING_URI for both)")
    if [m.value for m in history] != [report["mlflow_value"]]:
        return Check("mlflow from a node", False, f"the metric written on {report['host']} reads back as "
                     f"{[m.value for m in history]}", "compute nodes and this machine must reach the same store")
    return Check("mlflow from a node", True, f"a metric written on {report['host']} reads back here from {shown(uri)}")
