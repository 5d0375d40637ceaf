"""Profiles, resources per run and submitit parameters: pure functions, golden values."""

from __future__ import annotations

import math
import shutil
import textwrap
from pathlib import Path

import pytest

from diffsweep.config import ConfigError
from diffsweep.launch.profile_choice import load_profile, parse_profile
from diffsweep.launch.profiles import LOCAL
from diffsweep.launch.resources import (
    COMPILE_MINUTES,
    Resources,
    chunks,
    cpu_resources,
    estimate_resources,
    slurm_parameters,
)
from diffsweep.launch.scheduler import get_scheduler
from diffsweep.sweep import expand, load_sweep
from tests.helpers.gpu import skip_or_fail

REPO = Path(__file__).resolve().parents[2]


def estimate(run, profile, gpus=None):
    """``estimate_resources`` as the planner calls it: on what the profile's scheduler reserves."""
    return estimate_resources(run, profile, gpus, reserves=get_scheduler(profile.executor).reserves_resources)


def cpus(profile):
    return cpu_resources(profile, reserves=get_scheduler(profile.executor).reserves_resources)


def planned(tmp_path: Path, sizes: list[str], kind: str = "diff_v1"):
    path = tmp_path / "s.yaml"
    path.write_text(f"grid: {{model.size: [{', '.join(sizes)}]}}\nset: {{model.attention.kind: {kind}}}\n")
    return expand(load_sweep(path)).runs


def test_paper_sizes_on_h100(tmp_path):
    h100 = load_profile(str(REPO / "slurm/profiles/h100-example.yaml"))
    assert h100.executor == "slurm" and h100.executor_params["partition"] == "gpu"
    runs = {r.size: r for r in planned(tmp_path, ["830M", "1.4B", "2.8B", "6.8B", "13.1B"])}
    gpus = {size: estimate(r, h100).resources.gpus for size, r in runs.items()}
    # diffsweep.model.memory at the paper recipe (micro-batch 1, T = 2048, bf16, no activation
    # checkpointing): sharded state + activations + logits + overhead within 90% of 80 GB. 6.8B
    # does not fit on 2 GPUs and 3 do not divide its 128 sequences; 13.1B needs a whole node.
    assert gpus == {"830M": 1, "1.4B": 1, "2.8B": 1, "6.8B": 4, "13.1B": 8}
    for size in gpus:
        assert estimate(runs[size], h100).memory_gb <= 0.9 * 80
    e = estimate(runs["1.4B"], h100)
    # 1.4B, 10.5B tokens: 6ND-style FLOPs / (989 TFLOP/s x 0.40) -> about 72 GPU-hours, and the
    # minutes its job start compiles (train.compile auto, sdpa, on a GPU)
    assert e.gpu_hours == pytest.approx(runs["1.4B"].flops / (989e12 * 0.40) / 3600 + COMPILE_MINUTES / 60)
    assert 60 < e.gpu_hours < 90
    assert e.resources.time_min == 48 * 60  # capped at the partition limit: it requeues from checkpoints
    big = estimate(runs["13.1B"], h100).resources
    assert (big.nodes, big.gpus_per_node, big.tasks_per_node) == (1, 8, 8)  # one process per GPU


@pytest.mark.parametrize(("settings", "compiled"), [
    ("", True), ("model.attention.backend: triton", False), ("train.compile: false", False),
    ("train.compile: true", True)], ids=["auto-sdpa", "auto-triton", "false", "true"])
def test_plan_counts_the_minutes_a_compiled_run_compiles(tmp_path, settings, compiled):
    h100 = load_profile(str(REPO / "slurm/profiles/h100-example.yaml"))
    path = tmp_path / "s.yaml"
    path.write_text("grid: {model.size: [830M]}\nset:\n  train.max_steps: 4000\n  model.attention.kind: diff_v1\n"
                    + (f"  {settings}\n" if settings else ""))
    (run,) = expand(load_sweep(path)).runs
    e = estimate(run, h100)
    training = run.flops / (989e12 * 0.40) / 3600
    assert e.hours == pytest.approx(training + (COMPILE_MINUTES / 60 if compiled else 0))
    assert e.resources.time_min == math.ceil(e.hours * 60 * 1.3 + 15)
    (local,) = planned(tmp_path, ["tiny-xs"])
    assert estimate(local, LOCAL).hours == pytest.approx(local.flops / (LOCAL.gpu.peak_tflops * 1e12 * LOCAL.gpu.mfu) / 3600)


def test_local_profile_uses_no_gpus(tmp_path):
    (r,) = planned(tmp_path, ["tiny-xs"])
    e = estimate(r, LOCAL)
    assert e.resources.gpus == 0 and e.gpu_hours == 0 and e.hours > 0


def test_slurm_parameters_golden():
    profile = load_profile(str(REPO / "slurm/profiles/h100-example.yaml"))
    resources = Resources(nodes=2, gpus_per_node=8, tasks_per_node=8, cpus_per_task=16, mem_gb=1600, time_min=2880)
    params = slurm_parameters(resources, profile, job_name="fig3a-0", code_dir="/scratch/my sweeps/code/abc",
                              max_parallel=4)
    assert params == {
        "partition": "gpu",
        "account": "my-project",
        "constraint": "h100",
        "job_name": "fig3a-0",
        "nodes": 2,
        "ntasks_per_node": 8,
        "cpus_per_task": 16,
        "mem": "1600GB",
        "time": 2880,
        "signal_delay_s": 180,
        "setup": ["export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-1}",  # threads = the task's CPUs
                  "export MKL_NUM_THREADS=${SLURM_CPUS_PER_TASK:-1}",
                  "source $HOME/venvs/diffsweep/bin/activate",
                  "export PYTHONPATH='/scratch/my sweeps/code/abc'${PYTHONPATH:+:$PYTHONPATH}"],
        "additional_parameters": {"requeue": True},  # sites with JobRequeue=0 requeue only on request
        "gpus_per_node": 8,
        "srun_args": ["--kill-on-bad-exit=1"],  # 16 tasks: one dying ends the others
        "array_parallelism": 4,
    }
    one = Resources(nodes=1, gpus_per_node=1, tasks_per_node=1, cpus_per_task=16, mem_gb=200, time_min=60)
    assert "srun_args" not in slurm_parameters(one, profile, job_name="x", code_dir="/c", max_parallel=None)


def test_the_profiles_own_thread_settings_and_sbatch_parameters_are_kept():
    profile = parse_profile({"setup": ["export OMP_NUM_THREADS=4"],
                             "executor_params": {"additional_parameters": {"mail_type": "END"}}}, "p.yaml", "p")
    one = Resources(nodes=1, gpus_per_node=1, tasks_per_node=1, cpus_per_task=16, mem_gb=200, time_min=60)
    params = slurm_parameters(one, profile, job_name="x", code_dir="/c", max_parallel=None)
    assert params["setup"][:2] == ["export MKL_NUM_THREADS=${SLURM_CPUS_PER_TASK:-1}", "export OMP_NUM_THREADS=4"]
    assert params["additional_parameters"] == {"requeue": True, "mail_type": "END"}


def test_slurm_parameters_make_a_valid_sbatch_script(tmp_path):
    import submitit

    if shutil.which("srun") is None:  # submitit's SlurmExecutor refuses to exist without it
        skip_or_fail("needs Slurm's srun on PATH (bash slurm/start-cluster.sh installs Slurm)", "DIFFSWEEP_REQUIRE_SLURM")

    profile = load_profile(str(REPO / "slurm/profiles/localhost.yaml"))
    resources = Resources(nodes=1, gpus_per_node=1, tasks_per_node=1, cpus_per_task=1, mem_gb=2, time_min=60)
    ex = submitit.SlurmExecutor(folder=tmp_path)
    ex.update_parameters(**slurm_parameters(resources, profile, job_name="t-0", code_dir=str(tmp_path / "code"),
                                            max_parallel=None))
    text = ex._make_submission_file_text("python -m x", "uid")
    for line in ("#SBATCH --partition=debug", "#SBATCH --gpus-per-node=1", "#SBATCH --time=60",
                 "#SBATCH --signal=USR2@30", "#SBATCH --job-name=t-0", "#SBATCH --requeue\n",
                 "export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-1}\n", f"export PYTHONPATH={tmp_path / 'code'}"):
        assert line in text


def test_chunks_respect_max_array_size():
    assert chunks(5, 2) == [range(0, 2), range(2, 4), range(4, 5)]
    assert chunks(3, 1001) == [range(0, 3)]


@pytest.mark.parametrize("text, match", [
    ("executor_params: {partitoin: gpu}\n", (r"executor_params.partitoin: submitit's Slurm executor does not accept this parameter "
                                  r"\(did you mean 'partition'")),
    ("executor_params: {time: 60}\n", "derived per run"),
    ("executor_params: {partition: 'gpu; rm -rf /'}\n", "not allowed in an #SBATCH line"),
    ("gpus: 8\n", r"unknown profile key \(did you mean 'gpu'"),
    ("executor: kubernetes\n", r"executor: unknown scheduler 'kubernetes'; expected one of \[slurm, local\]"),
    ("gpu: {name: H100, mfu: 4}\n", "fraction"),
    ("gpus_per_node: -1\n", "integer >= 0"),
])
def test_bad_profiles(text, match):
    import yaml

    with pytest.raises(ConfigError, match=match):
        parse_profile(yaml.safe_load(textwrap.dedent(text)), "p.yaml", "p")


def test_unknown_profile_name_lists_the_known_ones():
    with pytest.raises(ConfigError, match=r"unknown profile 'nope'; expected one of \[.*h100-example.*localhost"):
        load_profile("nope")


def test_gpus_per_run_must_be_whole_nodes_and_split_the_batch(tmp_path):
    h100 = load_profile(str(REPO / "slurm/profiles/h100-example.yaml"))  # 8 GPUs per node
    (run,) = planned(tmp_path, ["1.4B"])
    assert estimate(run, h100, gpus=2).resources.gpus == 2
    assert estimate(run, h100, gpus=16).resources.nodes == 2
    with pytest.raises(ConfigError, match="launch.gpus_per_run: 12 GPUs are not whole nodes of 8"):
        estimate(run, h100, gpus=12)
    with pytest.raises(ConfigError, match="launch.gpus_per_run: 3 GPUs x micro-batch 1 do not divide the 128"):
        estimate(run, h100, gpus=3)


def test_cpu_jobs_ask_for_no_gpus_golden():
    """``data prepare --launch`` tasks: the profile's cpu_jobs (localhost: 1 CPU, 1 GB), its longest
    time, no GPUs; the defaults elsewhere; a process taking what it finds on the local executor."""

    localhost = load_profile(str(REPO / "slurm/profiles/localhost.yaml"))
    resources = cpus(localhost)
    assert resources == Resources(nodes=1, gpus_per_node=0, tasks_per_node=1, cpus_per_task=1, mem_gb=1, time_min=120)
    params = slurm_parameters(resources, localhost, job_name="prepare-ds", code_dir="/c", max_parallel=None)
    assert "gpus_per_node" not in params and "srun_args" not in params
    assert (params["cpus_per_task"], params["mem"], params["time"], params["ntasks_per_node"]) == (1, "1GB", 120, 1)
    h100 = cpus(load_profile(str(REPO / "slurm/profiles/h100-example.yaml")))
    assert (h100.cpus_per_task, h100.mem_gb, h100.time_min, h100.gpus) == (1, 8, 48 * 60, 0)
    assert cpus(LOCAL).mem_gb == 0 and cpus(LOCAL).describe() == "local process"


def test_a_profile_cpu_jobs_key_is_checked(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("cpu_jobs: {cpus: 2, gpus: 1}\n")
    with pytest.raises(ConfigError, match="cpu_jobs.gpus"):
        load_profile(str(path))
    path.write_text("cpu_jobs: {cpus: 4, mem_gb: 32, time_hours: 0.5}\n")

    assert cpus(load_profile(str(path))).time_min == 30
