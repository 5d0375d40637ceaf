"""A sweep's ``eval:`` section: every launched job evaluates its run once trained (the newest
checkpoint and the chosen steps), locally and on the localhost Slurm cluster; a bad section is one
line at plan time and nothing is launched."""

from __future__ import annotations

import json

import pytest

from tests.helpers.cli import run as cli
from tests.helpers.tracking import mlflow_client
from tests.launch.conftest import require_slurm, wait_for, write_sweep

EVAL = ("eval:\n  probes: [outliers, nll_position]\n  settings:\n    outliers: {tokens: 64}\n"
        "    nll_position: {documents: 2}\n  steps: [2]\n")


def evaluations(store: dict, experiment: str = "t") -> list[tuple[str, str, str]]:
    """(sweep row, probe, step) of every FINISHED evaluation run in the experiment."""
    client = mlflow_client(store["MLFLOW_TRACKING_URI"])
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id], "tags.`diffsweep.kind` = 'eval'")
    return sorted((r.data.tags["diffsweep.eval.sweep_run"], r.data.tags["diffsweep.eval.probe"],
                   r.data.tags["diffsweep.eval.step"]) for r in runs if r.info.status == "FINISHED")


def finished(tmp_path, evaluated: bool = False) -> bool:
    """Whether every run's job.json says finished (and, with ``evaluated``, that it evaluated)."""
    runs = list((tmp_path / "runs" / "t" / "runs").glob("*/job.json"))
    states = [json.loads(p.read_text()) for p in runs]
    return len(states) == 2 and all(s["state"] == "finished" and (not evaluated or "evaluated" in s) for s in states)


def expected(kinds=("transformer", "diff_v1")) -> list[tuple[str, str, str]]:
    return sorted((f"{k}-tiny-xs-s0", p, s) for k in kinds for p in ("outliers", "nll_position") for s in ("2", "4"))


@pytest.mark.parametrize("section, line", [
    ("eval: {probes: [outlier]}\n", "eval.probes: unknown probe 'outlier' (did you mean 'outliers'?)"),
    ("eval: {probes: [outliers], settings: {outliers: {tokns: 3}}}\n",
     "eval.settings.outliers.tokns: unknown setting of probe outliers (did you mean 'tokens'?)"),
    ("eval: {probes: [outliers], settings: {needle: {samples: 3}}}\n",
     "eval.settings.needle: sets probe 'needle', which eval.probes does not list"),
    ("eval: {probes: [attention_focus], settings: {attention_focus: {context: 4096}}}\n",
     "eval.settings.attention_focus.context: 4096 tokens is longer than the model's training length (32)"),
    ("eval: {probes: [outliers], steps: [0]}\n", "eval.steps[0]: expected an integer >= 1"),
])
def test_a_bad_eval_section_is_one_line_and_launches_nothing(tmp_path, text_dataset, section, line):
    sweep = write_sweep(tmp_path / "t.yaml", text_dataset, extra=section)
    for command in ("plan", "launch") if "outlier]" in section else ("launch",):  # launch plans first
        r = cli(command, str(sweep), "--executor", "local", cwd=tmp_path)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and line in r.stderr, (command, r.stderr)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.yaml"]


def test_local_jobs_evaluate_their_runs_once_trained(tmp_path, text_dataset, store):
    sweep = write_sweep(tmp_path / "t.yaml", text_dataset, steps=4, extra=EVAL)
    r = cli("launch", str(sweep), "--executor", "local", "--wait", cwd=tmp_path, env=store)
    assert r.returncode == 0, r.stdout + r.stderr
    assert evaluations(store) == expected()
    for run_dir in (tmp_path / "runs" / "t" / "runs").iterdir():
        job = json.loads((run_dir / "job.json").read_text())
        assert job["state"] == "finished" and job["evaluated"] == ["nll_position", "outliers"], job
        assert (run_dir / "eval" / "step_00000002" / "outliers" / "outliers.json").is_file()
    # evaluating the sweep here: what the jobs evaluated is skipped, new settings are evaluated run by run
    r = cli("eval", str(sweep), "--probe", "outliers", "--probe", "nll_position", "--probe-set", "outliers.tokens=64",
            "--probe-set", "nll_position.documents=3", "--json", cwd=tmp_path, env=store)
    assert r.returncode == 0 and "4 evaluations of 2 finished runs: 2 evaluated, 2 reused" in r.stderr, r.stderr
    done = json.loads(r.stdout)
    assert [(e["probe"], e["ran"]) for e in done] == [("outliers", False), ("nll_position", True)] * 2
    for e in done:  # one line each, naming the run, the probe, its headline and how it came
        line = f"{e['run']} step 4 {e['probe']}: {e['headline']} = {e['value']:.6g}; "
        assert line + ("evaluated in" if e["ran"] else "reused: logged") in r.stderr, r.stderr
    client = mlflow_client(store["MLFLOW_TRACKING_URI"])
    tags = client.get_run(done[1]["mlflow_run_id"]).data.tags
    assert tags["diffsweep.eval.sweep"] == "t" and tags["mlflow.parentRunId"] == tags["diffsweep.eval.source_run"]
    assert {client.get_run(e["mlflow_run_id"]).data.tags["diffsweep.eval.sweep_run"] for e in done} == \
        {"transformer-tiny-xs-s0", "diff_v1-tiny-xs-s0"}
    # the sweep's comparison of training runs is not confused by the evaluation runs
    r = cli("compare", str(sweep), "--json", cwd=tmp_path, env=store)
    assert r.returncode == 0 and len(json.loads(r.stdout)["rows"]) == 2, r.stdout + r.stderr
    # another probe, as jobs of the local queue (the runs' jobs again: the trainers return at once),
    # waiting until they end: each job's evaluation is said when it returns
    r = cli("eval", str(sweep), "--probe", "quantization", "--probe-set", "quantization.tokens=64", "--launch",
            "--executor", "local", "--wait", cwd=tmp_path, env=store)
    assert r.returncode == 0 and "submitted 2 evaluation jobs (quantization)" in r.stdout, r.stdout + r.stderr
    for name in ("transformer-tiny-xs-s0", "diff_v1-tiny-xs-s0"):
        assert f"{name}: evaluated quantization" in r.stdout, r.stdout
    assert sum(p == "quantization" for _, p, _ in evaluations(store)) == 2
    assert finished(tmp_path)
    s = json.loads(cli("status", str(sweep), "--executor", "local", "--json", cwd=tmp_path, env=store).stdout)
    assert s["counts"] == {"done": 2}
    # a new row, not launched: reported as not finished, nothing evaluated
    sweep.write_text(sweep.read_text().replace("[transformer, diff_v1]", "[transformer, diff_v1, diff_v2]"))
    r = cli("eval", str(sweep), "--probe", "outliers", "--only", "diff_v2", cwd=tmp_path, env=store)
    assert r.returncode == 0 and "0 evaluations of 0 finished runs: 0 evaluated, 0 reused; 1 run not finished yet" \
        in r.stdout, r.stdout


@pytest.mark.slurm
def test_slurm_jobs_evaluate_their_runs_once_trained(tmp_path, text_dataset, store):
    require_slurm()
    sweep = write_sweep(tmp_path / "t.yaml", text_dataset, steps=4, extra=EVAL)
    r = cli("launch", str(sweep), "--profile", "localhost", cwd=tmp_path, env=store)
    assert r.returncode == 0 and "Slurm array" in r.stdout, r.stdout + r.stderr

    def done() -> bool:
        s = cli("status", str(sweep), "--profile", "localhost", "--json", cwd=tmp_path, env=store)
        return json.loads(s.stdout)["counts"] == {"done": 2}

    # polled cheaply: the run directories' job.json, then status once
    wait_for(lambda: finished(tmp_path, evaluated=True), 300, "both runs trained and evaluated", poll=2)
    assert done()
    assert evaluations(store) == expected()
    for run_dir in (tmp_path / "runs" / "t" / "runs").iterdir():
        assert json.loads((run_dir / "job.json").read_text())["evaluated"] == ["nll_position", "outliers"]
    # another probe on the finished runs, as a Slurm array with the runs' training resources
    r = cli("eval", str(sweep), "--probe", "quantization", "--probe-set", "quantization.tokens=64", "--launch",
            "--profile", "localhost", "--wait", cwd=tmp_path, env=store)
    assert r.returncode == 0 and "submitted 2 evaluation jobs" in r.stdout and "Slurm array" in r.stdout, r.stdout
    for name in ("transformer-tiny-xs-s0", "diff_v1-tiny-xs-s0"):
        assert f"{name}: evaluated quantization" in r.stdout, r.stdout
    assert sum(p == "quantization" for _, p, _ in evaluations(store)) == 2
    assert finished(tmp_path) and done()
