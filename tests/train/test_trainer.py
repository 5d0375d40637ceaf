"""The trainer end to end on real text with a real MLflow store: bitwise resume from any
checkpoint, preemption by a real signal, crashes, divergence, and what a run logs."""

from __future__ import annotations

import json
import os
import shutil
import signal

import pytest
import torch
import yaml

from diffsweep.compare.runs import diverged
from diffsweep.config import ConfigError, load_config
from diffsweep.config.identity import run_key
from diffsweep.model.transformer import build_model
from diffsweep.train.checkpoint import SINGLE_FILE_FORMAT, list_checkpoints, load_checkpoint, load_tensors
from diffsweep.train.optim import build_optimizer
from diffsweep.train.run_record import RUN_FILE
from diffsweep.train.trainer import Diverged, train
from tests.helpers.tracking import mlflow_client
from tests.helpers.training import KINDS, history, quiet, recorder, tiny

# ``store_client`` (a client of the session's MLflow store, which training tracks to): tests/train/conftest.py


@pytest.mark.parametrize("kind", KINDS)
def test_resume_from_every_checkpoint_is_bitwise_identical(kind, text_dataset, store_client, tmp_path):
    """Resuming from any checkpoint reproduces every later metric of the uninterrupted run
    exactly (train loss, grad norm, validation slices, λ, outliers)."""
    cfg = tiny(text_dataset, f"model.attention.kind={kind}")
    full: dict = {}
    result = train(cfg, tmp_path / "full", experiment=f"resume-{kind}", callbacks=(recorder(full),), echo=quiet)
    assert result.status == "finished" and sorted(full) == list(range(1, 13))
    checkpoints = list_checkpoints(tmp_path / "full" / "checkpoints")
    assert [load_checkpoint(c)["step"] for c in checkpoints] == [2, 4, 6, 8, 10, 12]
    for checkpoint in checkpoints[:-1]:
        step = load_checkpoint(checkpoint)["step"]
        resumed: dict = {}
        train(cfg, tmp_path / f"from{step}", resume_from=checkpoint, callbacks=(recorder(resumed),), echo=quiet)
        assert resumed == {s: m for s, m in full.items() if s > step}, f"resumed from step {step}"
    assert full[12]["val/loss"] < full[4]["val/loss"]  # it learns


def test_a_run_logs_what_a_researcher_needs(text_dataset, store_client, tmp_path):
    cfg = tiny(text_dataset, "model.attention.kind=diff_v1")
    result = train(cfg, tmp_path / "run", experiment="contents", echo=quiet)
    run = store_client.get_run(result.run_id)
    assert run.info.status == "FINISHED"
    assert run.info.run_name.startswith("tiny-xs-diff_v1-seed0-")
    params = run.data.params
    assert params["model.attention.kind"] == "diff_v1" and params["train.seq_len"] == "32"
    assert params["model.attention.num_heads"] == "2"  # resolved, not declared
    tags = run.data.tags
    assert tags["diffsweep.arch"] == "diff_v1" and tags["diffsweep.size"] == "tiny-xs"
    assert tags["diffsweep.run_key"] == run_key(cfg)
    assert int(tags["diffsweep.params"]) == sum(p.numel() for p in torch.nn.Module.parameters(
        __import__("diffsweep.model.transformer", fromlist=["x"]).build_model(cfg.model)))
    assert len(tags["diffsweep.git_commit"]) in (40, len("unknown")) and tags["diffsweep.git_dirty"] in ("true", "false", "unknown")
    assert tags["diffsweep.host"]
    config_yaml = store_client.download_artifacts(result.run_id, "config.yaml", str(tmp_path))
    assert load_config(config_yaml) == cfg  # the artifact reproduces the run's config
    assert [s for s, _ in history(store_client, result.run_id, "train/loss")] == list(range(1, 13))
    for key in ("train/lr", "train/grad_norm", "train/tokens", "train/tokens_per_s", "train/loss_spikes",
                "train/grad_norm_spikes"):
        assert len(history(store_client, result.run_id, key)) == 12, key
    assert history(store_client, result.run_id, "train/tokens")[-1] == (12, 12 * 128)
    for key in ("val/loss", "val/loss_ar_hit", "val/loss_others", "val/ar_hit_fraction", "lambda/layer_01",
                "lambda/layer_02", "outliers/attn_logit_top1", "outliers/hidden_top1"):
        assert [s for s, _ in history(store_client, result.run_id, key)] == [4, 8, 12], key
    assert "train/mfu" not in run.data.metrics  # CPU: no MFU
    ar, others, frac = (run.data.metrics[k] for k in ("val/loss_ar_hit", "val/loss_others", "val/ar_hit_fraction"))
    assert run.data.metrics["val/loss"] == pytest.approx(frac * ar + (1 - frac) * others, rel=1e-9)


def test_diff_v2_logs_lambda_mean_and_spread(text_dataset, store_client, tmp_path):
    result = train(tiny(text_dataset, "model.attention.kind=diff_v2"), tmp_path / "run", experiment="v2", echo=quiet)
    metrics = store_client.get_run(result.run_id).data.metrics
    for layer in ("01", "02"):
        assert 0.0 < metrics[f"lambda/layer_{layer}/mean"] < 1.0  # sigmoid λ
        assert metrics[f"lambda/layer_{layer}/std"] > 0.0


@pytest.mark.parametrize("sig", [signal.SIGUSR2, signal.SIGTERM], ids=["SIGUSR2", "SIGTERM"])
def test_signal_saves_at_step_boundary_and_resume_continues_the_same_mlflow_run(sig, text_dataset, store_client, tmp_path):
    """SIGUSR2 or SIGTERM mid-run: checkpoint at that step, run KILLED; relaunch resumes the same MLflow run
    and its history has every step exactly once, equal to an uninterrupted run's."""
    cfg = tiny(text_dataset, "model.attention.kind=diff_v1")
    reference = train(cfg, tmp_path / "reference", experiment="signal-ref", echo=quiet)

    def preempt_at_5(step, metrics):
        if step == 5:
            os.kill(os.getpid(), sig)

    run_dir = tmp_path / "run"
    first = train(cfg, run_dir, experiment="signal", callbacks=(preempt_at_5,), echo=quiet)
    assert (first.status, first.step) == ("preempted", 5)
    assert load_checkpoint(list_checkpoints(run_dir / "checkpoints")[-1])["step"] == 5
    killed = store_client.get_run(first.run_id)
    assert killed.info.status == "KILLED" and sig.name in killed.data.tags["diffsweep.end_reason"]
    assert signal.getsignal(sig) is signal.SIG_DFL  # handlers restored

    second = train(cfg, run_dir, experiment="signal", echo=quiet)
    assert second.status == "finished" and second.run_id == first.run_id
    assert store_client.get_run(first.run_id).info.status == "FINISHED"
    for key in ("train/loss", "train/grad_norm", "val/loss", "lambda/layer_01"):
        assert history(store_client, first.run_id, key) == history(store_client, reference.run_id, key), key


def test_a_crash_before_the_first_checkpoint_reuses_the_run_without_duplicates(text_dataset, store_client, tmp_path):
    cfg = tiny(text_dataset)

    def crash_at_1(step, metrics):
        if step == 1:
            raise RuntimeError("node lost")

    run_dir = tmp_path / "run"
    with pytest.raises(RuntimeError, match="node lost"):
        train(cfg, run_dir, experiment="crash", callbacks=(crash_at_1,), echo=quiet)
    assert not list_checkpoints(run_dir / "checkpoints")
    run_id = yaml.safe_load((run_dir / RUN_FILE).read_text())["run_id"]
    failed = store_client.get_run(run_id)
    assert failed.info.status == "FAILED" and "node lost" in failed.data.tags["diffsweep.end_reason"]
    assert [s for s, _ in history(store_client, run_id, "train/loss")] == [1]
    result = train(cfg, run_dir, experiment="crash", echo=quiet)
    assert result.run_id == run_id
    assert [s for s, _ in history(store_client, run_id, "train/loss")] == list(range(1, 13))


def test_divergence_stops_at_once_marks_failed_and_keeps_the_last_good_checkpoint(text_dataset, store_client, tmp_path):
    cfg = tiny(text_dataset, "train.lr=1e30", "train.checkpoint_every=1")
    run_dir = tmp_path / "run"
    with pytest.raises(Diverged, match="non-finite") as caught:
        train(cfg, run_dir, experiment="diverge", echo=quiet)
    checkpoints = list_checkpoints(run_dir / "checkpoints")
    assert checkpoints, "the steps before divergence were checkpointed"
    last = load_checkpoint(checkpoints[-1])
    assert f"at step {last['step'] + 1}" in str(caught.value)  # nothing saved at or after the bad step
    weights = build_model(cfg.model).state_dict()
    load_tensors(checkpoints[-1], {"model": weights})
    assert all(torch.isfinite(t).all() for t in weights.values())
    run_id = yaml.safe_load((run_dir / RUN_FILE).read_text())["run_id"]
    run = store_client.get_run(run_id)
    assert run.info.status == "FAILED" and "non-finite" in run.data.tags["diffsweep.end_reason"]
    assert diverged(run)  # what compare marks as a diverged candidate of a tuned sweep


def test_a_finished_run_is_not_trained_again(text_dataset, store_client, tmp_path):
    cfg = tiny(text_dataset)
    first = train(cfg, tmp_path / "run", experiment="again", echo=quiet)
    before = len(store_client.search_runs([store_client.get_experiment_by_name("again").experiment_id]))
    steps: list[int] = []
    second = train(cfg, tmp_path / "run", experiment="again", callbacks=(lambda s, m: steps.append(s),), echo=quiet)
    assert (second.status, second.run_id, steps) == ("finished", first.run_id, [])
    assert len(store_client.search_runs([store_client.get_experiment_by_name("again").experiment_id])) == before


def test_resuming_with_another_config_or_dataset_is_refused(text_dataset, store_client, tmp_path):
    data = tmp_path / "dataset"
    shutil.copytree(text_dataset, data)
    cfg = tiny(data)
    train(cfg, tmp_path / "run", experiment="refuse", echo=quiet)
    checkpoint = list_checkpoints(tmp_path / "run" / "checkpoints")[0]
    with pytest.raises(ConfigError, match="different config"):
        train(tiny(data, "train.lr=1e-3"), tmp_path / "other", resume_from=checkpoint, echo=quiet)
    meta = json.loads((data / "meta.json").read_text())
    meta["fingerprint"] = "0" * 64  # as if the dataset at this path had been re-prepared
    (data / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ConfigError, match="different dataset"):
        train(cfg, tmp_path / "run", echo=quiet)


@pytest.mark.parametrize("kind", KINDS)
def test_bf16_autocast_trains_on_cpu(kind, text_dataset, store_client, tmp_path):
    """precision: bf16 (what GPUs get by default) runs the same loop under autocast."""
    seen: dict = {}
    cfg = tiny(text_dataset, f"model.attention.kind={kind}", "train.precision=bf16", "train.max_steps=4")
    result = train(cfg, tmp_path / "run", experiment="bf16", callbacks=(recorder(seen),), echo=quiet)
    assert result.status == "finished"
    assert all(torch.isfinite(torch.tensor(m["train/loss"])) for m in seen.values())
    assert seen[4]["train/loss"] < seen[1]["train/loss"]


def test_relaunching_a_complete_run_repairs_its_mlflow_status(text_dataset, store_client, tmp_path):
    """A job that died after its last checkpoint but before ending its MLflow run: the relaunch
    trains nothing and marks the run FINISHED."""
    cfg = tiny(text_dataset, "train.max_steps=4")
    first = train(cfg, tmp_path / "run", experiment="repair", echo=quiet)
    store_client.update_run(first.run_id, status="RUNNING")
    train(cfg, tmp_path / "run", experiment="repair", echo=quiet)
    assert store_client.get_run(first.run_id).info.status == "FINISHED"


def test_a_deleted_experiment_is_a_config_error_before_anything_is_created(text_dataset, store_client, tmp_path):
    experiment_id = store_client.create_experiment("deleted-one")
    store_client.delete_experiment(experiment_id)
    with pytest.raises(ConfigError, match="deleted"):
        train(tiny(text_dataset), tmp_path / "run", experiment="deleted-one", echo=quiet)
    assert not store_client.search_runs([experiment_id], run_view_type=3)
    assert not (tmp_path / "run").exists()


def test_resume_from_another_directory_uses_the_runs_own_store(text_dataset, tmp_path, monkeypatch):
    """With the default store (no MLFLOW_TRACKING_URI), a run resumed from elsewhere keeps logging
    to the mlflow.db it started in; pointing MLFLOW_TRACKING_URI at another store is refused."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    first_cwd, other_cwd = tmp_path / "a", tmp_path / "b"
    first_cwd.mkdir(), other_cwd.mkdir()
    run_dir = tmp_path / "runs" / "run"
    cfg = tiny(text_dataset)

    def preempt_at_3(step, metrics):
        if step == 3:
            os.kill(os.getpid(), signal.SIGUSR2)

    monkeypatch.chdir(first_cwd)
    first = train(cfg, run_dir, experiment="moved", callbacks=(preempt_at_3,), echo=quiet)
    monkeypatch.chdir(other_cwd)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{other_cwd / 'other.db'}")
    with pytest.raises(ConfigError, match="MLFLOW_TRACKING_URI.*is not where"):
        train(cfg, run_dir, experiment="moved", echo=quiet)
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    second = train(cfg, run_dir, experiment="moved", echo=quiet)
    assert second.run_id == first.run_id and not list(other_cwd.iterdir())
    client = mlflow_client(f"sqlite:///{first_cwd / 'mlflow.db'}")
    assert [s for s, _ in history(client, first.run_id, "train/loss")] == list(range(1, 13))


@pytest.mark.parametrize("layout", ["by-name", "by-position"])
def test_a_single_file_checkpoint_from_before_sharding_still_resumes(layout, text_dataset, store_client, tmp_path):
    """Checkpoints written before sharded checkpoints were one ``step_XXXXXXXX.pt`` file with the
    whole state: keyed by parameter name, or (before multi-process training) the optimizer state
    by position. Either resumes on one process and continues exactly."""
    cfg = tiny(text_dataset, "model.attention.kind=diff_v1")
    full: dict = {}
    train(cfg, tmp_path / "full", experiment="old-format", callbacks=(recorder(full),), echo=quiet)
    sharded = list_checkpoints(tmp_path / "full" / "checkpoints")[2]
    state = load_checkpoint(sharded)  # step 6
    model = build_model(cfg.model)
    optimizer = build_optimizer(model, cfg.train)
    from diffsweep.train.distributed import load_sharded_state, sharded_state

    tensors, _ = sharded_state(model, optimizer)
    load_tensors(sharded, tensors)
    optim_state = {"state": tensors["optimizer"], "param_groups": state.pop("optimizer_groups")}
    if layout == "by-position":
        load_sharded_state(model, optimizer, tensors, optim_state["param_groups"])
        optim_state = optimizer.state_dict()  # the old layout: state keyed 0, 1, 2, ...
        assert all(isinstance(k, int) for k in optim_state["state"])
    old = state | {"format": SINGLE_FILE_FORMAT, "model": tensors["model"], "optimizer": optim_state}
    path = tmp_path / "checkpoints" / "step_00000006.pt"
    path.parent.mkdir()
    torch.save(old, path)
    assert list_checkpoints(path.parent) == [path]
    resumed: dict = {}
    train(cfg, tmp_path / "resumed", resume_from=path, callbacks=(recorder(resumed),), echo=quiet)
    assert resumed == {s: m for s, m in full.items() if s > 6}


def test_activation_checkpointing_changes_memory_not_the_math(text_dataset, store_client, tmp_path):
    plain: dict = {}
    train(tiny(text_dataset, "model.attention.kind=diff_v1", "train.max_steps=4"), tmp_path / "a",
          experiment="ckpt", callbacks=(recorder(plain),), echo=quiet)
    recomputed: dict = {}
    train(tiny(text_dataset, "model.attention.kind=diff_v1", "train.max_steps=4", "train.activation_checkpointing=true"),
          tmp_path / "b", experiment="ckpt", callbacks=(recorder(recomputed),), echo=quiet)
    assert recomputed == plain


def _preempt_at(step_to_stop: int):
    def callback(step, metrics):
        if step == step_to_stop:
            os.kill(os.getpid(), signal.SIGUSR2)
    return callback


def test_every_attempt_is_recorded_with_its_job_code_and_first_step(text_dataset, store_client, tmp_path, monkeypatch):
    """Started as Slurm job 111 (array task 3), preempted at step 5, resumed as job 222 outside
    an array: both attempts are in the run's tags and attempts.json with their jobs, commits and
    first steps, and the top-level tags are the latest attempt's."""
    cfg = tiny(text_dataset, "train.max_steps=8")
    monkeypatch.setenv("SLURM_JOB_ID", "111")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "3")
    first = train(cfg, tmp_path / "run", experiment="attempts", callbacks=(_preempt_at(5),), echo=quiet)
    assert first.status == "preempted"
    monkeypatch.setenv("SLURM_JOB_ID", "222")
    monkeypatch.delenv("SLURM_ARRAY_TASK_ID")
    second = train(cfg, tmp_path / "run", experiment="attempts", echo=quiet)
    assert second.status == "finished" and second.run_id == first.run_id
    tags = store_client.get_run(first.run_id).data.tags
    attempt = {n: {k.removeprefix(f"diffsweep.attempt.{n}."): v for k, v in tags.items()
                   if k.startswith(f"diffsweep.attempt.{n}.")} for n in (1, 2)}
    assert tags["diffsweep.attempts"] == "2" and not any(k.startswith("diffsweep.attempt.3.") for k in tags)
    assert (attempt[1]["slurm_job_id"], attempt[1]["slurm_array_task_id"]) == ("111", "3")
    assert attempt[1]["first_step"] == "1"
    assert "checkpoint" not in attempt[1]
    assert (attempt[2]["slurm_job_id"], attempt[2]["first_step"]) == ("222", "6")
    assert "slurm_array_task_id" not in attempt[2]
    assert attempt[2]["checkpoint"] == str((tmp_path / "run" / "checkpoints" / "step_00000005").absolute())
    for n in (1, 2):
        assert attempt[n]["git_commit"] == tags["diffsweep.git_commit"] and attempt[n]["host"] == tags["diffsweep.host"]
        assert attempt[n]["processes"] == "1" and attempt[n]["started"].endswith("+00:00")
    assert tags["diffsweep.slurm_job_id"] == "222" and "diffsweep.slurm_array_task_id" not in tags
    recorded = json.loads(open(store_client.download_artifacts(first.run_id, "attempts.json", str(tmp_path))).read())
    assert recorded == [attempt[1], attempt[2]]


def test_resuming_a_run_from_before_attempts_keeps_its_first_attempts_origin(text_dataset, store_client, tmp_path,
                                                                              monkeypatch):
    """A run started before attempts were recorded has its origin only in the top-level tags:
    the first resume files those as attempt 1 before they become the resumed attempt's."""
    cfg = tiny(text_dataset, "train.max_steps=4")
    monkeypatch.setenv("SLURM_JOB_ID", "111")
    first = train(cfg, tmp_path / "run", experiment="attempts-old", callbacks=(_preempt_at(2),), echo=quiet)
    for key in [k for k in store_client.get_run(first.run_id).data.tags if k.startswith("diffsweep.attempt")]:
        store_client.delete_tag(first.run_id, key)  # as a run from before attempts were recorded
    monkeypatch.setenv("SLURM_JOB_ID", "222")
    train(cfg, tmp_path / "run", experiment="attempts-old", echo=quiet)
    tags = store_client.get_run(first.run_id).data.tags
    assert (tags["diffsweep.attempt.1.slurm_job_id"], tags["diffsweep.attempt.2.slurm_job_id"]) == ("111", "222")
    assert "diffsweep.attempt.1.first_step" not in tags and tags["diffsweep.attempt.2.first_step"] == "3"
    assert tags["diffsweep.slurm_job_id"] == "222" and tags["diffsweep.attempts"] == "2"
