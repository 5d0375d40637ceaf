"""The checks ``diffsweep doctor`` runs on a Slurm profile (``slurm_suite``, which
``SlurmScheduler.doctor_checks`` hands to ``diffsweep.launch.doctor.checks.run_doctor``), in order:

- the controller answers (``sinfo``) and accounting answers (``sacct``: submitit reads job states
  with it, and waits forever on a job that died without it);
- the profile's partition exists, its nodes have the profile's GPUs per node, of the profile's
  GPU type where the GRES names types, and its ``constraint`` is a node feature;
- a 1-task and a 2-task job start (within ``timeout_s``; else the pending reason), see the GPUs
  they asked for (``CUDA_VISIBLE_DEVICES`` from Slurm, and CUDA devices in torch), and the two
  tasks all-reduce (NCCL when both see a GPU, else gloo);
- the run directory is on a file system the compute nodes share (a token written here is read in
  the job, and one written in the job is read here);
- the MLflow store is usable here and takes a metric written *from the compute node*, read back here;
- with ``preempt``: a tiny training job (``diffsweep.launch.doctor.preempt``) gets USR2 as on
  preemption, checkpoints, is requeued by Slurm and resumes the same MLflow run with every step
  logged once.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from diffsweep import slurm
from diffsweep.config import ConfigError
from diffsweep.launch.doctor import probe as doctor_probe
from diffsweep.launch.doctor.checks import check_store_here
from diffsweep.launch.doctor.jobs import Check, doctor_executor, doctor_resources, submit
from diffsweep.launch.doctor.probe import METRIC
from diffsweep.launch.jobs import cluster
from diffsweep.launch.profiles import Profile


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
        from diffsweep.launch.doctor.preempt import check_preemption

        add(check_preemption(profile, work, timeout_s=max(timeout_s, 300.0)))


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
                         f"set executor_params.partition in profile {profile.name} to one of [{', '.join(known)}]")
        return Check("partition", True, "the cluster's default partition (the profile names none)")
    try:
        cluster.check_partition(profile)
    except ConfigError as exc:
        return Check("partition", False, f"{exc.key}: {exc.message}",
                     f"set executor_params.partition in profile {profile.name} to a partition of this cluster "
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
                         f"set executor_params.constraint in profile {profile.name} to node features (sinfo -o %f)")
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
    if two := reports.get(2):
        checks.append(_check_all_reduce(two))
    if uri is not None and (one := reports.get(1)):
        checks.append(_check_store_from_node(one[0], uri))
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
