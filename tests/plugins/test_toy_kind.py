"""An attention kind, a probe, a scaling-law form and a scheduler from the user's own package
(``toy_kind/``, entry points in the groups ``diffsweep.attention_kinds``, ``diffsweep.probes``,
``diffsweep.law_forms`` and ``diffsweep.schedulers``), installed with pip into a directory of its own
and used from the CLI as a user would: config -> count -> train 5 steps -> eval -> plan -> launch
through the scheduler -> fit. Nothing in diffsweep names them.

The package goes onto the subprocesses' PYTHONPATH only, so the shared environment and every other
test see the built-in kinds alone. The commands run one after another in one such process (``toy_cli``:
each as ``tests.helpers.cli.run`` runs it, the entry point the console script calls), which imports
torch and MLflow once for the module instead of once per command; the check of what ``--help``
imports at start-up has a fresh process of its own, as have the jobs the package's scheduler starts.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import TINY_RUN
from tests.scaling.synthetic import ladder

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = Path(__file__).parent / "toy_kind"


# One xdist group: one worker installs the toy package.
pytestmark = pytest.mark.xdist_group("toy_kind")


@pytest.fixture(scope="module")
def toy_env(tmp_path_factory) -> dict[str, str]:
    """Environment of a process that has the toy package installed (``pip install --target``)."""
    tmp = tmp_path_factory.mktemp("toy")
    source = shutil.copytree(PACKAGE, tmp / "src")  # pip builds in place: keep the repository clean
    site = tmp / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                        "--no-build-isolation", "--target", str(site), str(source)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    path = os.pathsep.join([str(ROOT), str(site), *filter(None, [os.environ.get("PYTHONPATH")])])
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    return env | {"PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}


# The process in which the module's commands run (``toy_env``: the toy package installed): it reads
# one request a line on stdin, ``[args, cwd, env]``, runs ``diffsweep ARGS`` in itself in ``cwd`` with
# ``env`` added to its environment (``tests.helpers.cli.run``) and answers one line,
# ``[exit code, stdout, stderr]``, on what was its stdout; its own fd 1 (where the processes it starts
# print, e.g. a launch's queue) then goes to its stderr.
DRIVER = """
import json, os, sys
replies = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
from tests.helpers.cli import run
for line in sys.stdin:
    args, cwd, env = json.loads(line)
    r = run(*args, cwd=cwd, env=env)
    replies.write(json.dumps([r.returncode, r.stdout, r.stderr]) + "\\n")
    replies.flush()
"""


@pytest.fixture(scope="module")
def toy_cli(toy_env, tmp_path_factory):
    """``toy_cli(cwd, *args, env=...)``: ``diffsweep ARGS`` run in the process with the toy package
    (``DRIVER``), ``env`` added to its environment; a ``subprocess.CompletedProcess``."""
    log = tmp_path_factory.mktemp("toy-driver") / "stderr"
    with open(log, "w") as err:
        driver = subprocess.Popen([sys.executable, "-c", DRIVER], cwd=ROOT, env=toy_env, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=err, text=True)

    def cli(cwd: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        driver.stdin.write(json.dumps([list(args), str(cwd), env or {}]) + "\n")
        driver.stdin.flush()
        reply = driver.stdout.readline()
        assert reply, f"the toy driver ended (exit {driver.wait()}): {log.read_text()[-4000:]}"
        code, out, err = json.loads(reply)
        return subprocess.CompletedProcess(["diffsweep", *args], code, out, err)

    yield cli
    driver.stdin.close()
    driver.wait(timeout=60)
    assert driver.returncode == 0, log.read_text()[-4000:]


def test_config_and_counts(toy_cli, toy_env, tmp_path):
    r = toy_cli(tmp_path, "config", "show", "--size", "tiny-xs", "--arch", "toy")
    assert r.returncode == 0, r.stderr
    assert "kind: toy" in r.stdout
    r = toy_cli(tmp_path, "model", "info", "--size", "tiny-xs", "--arch", "toy", "--check", "--json")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    # The counts come from the plug-in's spec and agree with its module built on the meta device.
    assert info["arch"] == "toy" and info["attention"]["weights"]["gate"] == [1]
    assert info["params"] == info["meta_params"]
    transformer = json.loads(toy_cli(tmp_path, "model", "info", "--size", "tiny-xs", "--json").stdout)
    assert info["params"] == transformer["params"] + 2  # one gate per layer, 2 layers
    # An unknown kind still fails in one line, listing the registered kinds (the plug-in's included).
    r = toy_cli(tmp_path, "config", "show", "--set", "model.attention.kind=toyy")
    assert r.returncode == 2 and "model.attention.kind" in r.stderr and "toy]" in r.stderr, r.stderr
    # The plug-in's spec is read by --help (its --arch list), and imports no torch there.
    code = ("import runpy, sys; sys.argv = ['diffsweep', 'train', '--help']\n"
            "try:\n    runpy.run_module('diffsweep', run_name='__main__')\nexcept SystemExit:\n    pass\n"
            "print('torch' in sys.modules, 'mlflow' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=toy_env, capture_output=True, text=True,
                       timeout=60)
    assert "toy" in r.stdout and r.stdout.strip().endswith("False False"), r.stdout + r.stderr


def test_train_logs_the_kinds_probe(toy_cli, tmp_path, text_dataset):
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    sets = [*TINY_RUN, f"data.path={text_dataset}", "model.attention.kind=toy", "train.max_steps=5",
            "train.eval_every=5", "train.checkpoint_every=5"]
    r = toy_cli(tmp_path, "train", *[f"--set={s}" for s in sets], env={"MLFLOW_TRACKING_URI": store})
    assert r.returncode == 0, r.stdout + r.stderr
    from mlflow.tracking import MlflowClient

    client = MlflowClient(store)
    (run,) = [run for e in client.search_experiments() for run in client.search_runs([e.experiment_id])]
    assert run.info.status == "FINISHED"
    assert len(client.get_metric_history(run.info.run_id, "train/loss")) == 5
    # The module's own parameter was initialised by its reset_parameters (1.0) and then trained.
    gate = run.data.metrics["gate/layer_01"]
    assert np.isfinite(gate) and abs(gate - 1.0) < 0.1
    assert "gate/layer_02" in run.data.metrics and "lambda/layer_01" not in run.data.metrics

    # The package's probe (``toy_kind/probe.py``, entry point ``gates``) on the trained run, as a built-in one.
    run_dir = next((tmp_path / "runs").iterdir())
    r = toy_cli(tmp_path, "eval", str(run_dir), "--probe", "gates", "--probe-set", "gates.scale=2", "--json",
            env={"MLFLOW_TRACKING_URI": store})
    assert r.returncode == 0, r.stdout + r.stderr
    (done,) = json.loads(r.stdout)
    layers = [v for k, v in run.data.metrics.items() if k.startswith("gate/layer_")]
    assert done["metrics"]["gates/layers"] == len(layers)
    assert done["metrics"]["gates/mean"] == pytest.approx(2 * sum(layers) / len(layers), rel=1e-5)
    assert "gates" in toy_cli(tmp_path, "eval", "--help").stdout  # listed beside the built-in probes


def test_plan_collapses_axes_the_kind_ignores_and_plans_its_memory(toy_cli, tmp_path):
    (tmp_path / "s.yaml").write_text(
        "set: {model.size: 1.4B}\n"
        "grid:\n"
        "  model.attention.kind: [transformer, diff_v1, toy]\n"
        "  model.attention.lambda_init: [exp_decay, 'constant:0.5']\n")
    r = toy_cli(tmp_path, "plan", "s.yaml", "--profile", "h100-example", "--json")
    assert r.returncode == 0, r.stderr
    runs = {run["name"]: run for run in json.loads(r.stdout)["runs"]}
    assert sorted(runs) == ["diff_v1-1.4B-lam_0.5-s0", "diff_v1-1.4B-lam_exp-s0", "toy-1.4B-s0",
                            "transformer-1.4B-s0"]
    toy, base = runs["toy-1.4B-s0"], runs["transformer-1.4B-s0"]
    assert toy["params"] == base["params"] + 24 and toy["arch"] == "toy"
    assert 0 < toy["memory_gb"] and toy["gpus"] >= 1


def test_a_sweep_of_the_kind_runs_through_the_packages_scheduler(toy_cli, tmp_path, text_dataset):
    """``--executor toy`` (``toy_kind/scheduler.py``, entry point ``toy``): plan names it, launch
    submits through it and waits, the ledger records it, and status asks it."""
    env = {"MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    sets = dict(s.split("=", 1) for s in [*TINY_RUN, f"data.path={text_dataset}", "train.max_steps=3"])
    (tmp_path / "s.yaml").write_text("name: toyq\nset:\n" + "".join(f"  {k}: {v}\n" for k, v in sets.items())
                                     + "grid: {model.attention.kind: [toy]}\n")
    r = toy_cli(tmp_path, "plan", "s.yaml", "--executor", "pbz", env=env)
    assert (r.returncode, r.stderr) == (2, "error: --executor: expected one of [slurm, local, toy], got 'pbz'\n")
    r = toy_cli(tmp_path, "launch", "s.yaml", "--executor", "toy", "--out", "out", "--wait", env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "the toy queue" in r.stdout, r.stdout
    ledger = json.loads((tmp_path / "out" / "ledger.json").read_text())
    (entry,) = ledger["entries"].values()
    assert [a["executor"] for a in entry["attempts"]] == ["toy"] and entry["name"].startswith("toy-")
    r = toy_cli(tmp_path, "status", "s.yaml", "--out", "out", "--json", env=env)
    assert r.returncode == 0, r.stderr
    assert [run["state"] for run in json.loads(r.stdout)["runs"]] == ["done"]


def test_fit_names_the_kind_by_its_display_name_and_fits_the_packages_law_form(toy_cli, tmp_path):
    points = ladder(noise_sd=0.003, seeds=2, rng=np.random.default_rng(1), ratios={"toy": 0.8})
    points.to_csv(tmp_path / "ladder.csv", index=False)
    r = toy_cli(tmp_path, "fit", "--csv", "ladder.csv", "--no-log", "--out", "fit", "--json")
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    assert result["candidates"] == ["toy"]
    assert "Toy gate needs" in (tmp_path / "fit" / "report.md").read_text()
    # the package's law form (toy_kind/law.py, entry point diffsweep.law_forms) is a --form like the built-in ones
    r = toy_cli(tmp_path, "fit", "--csv", "ladder.csv", "--no-log", "--form", "kaplan_nc", "--boot", "50",
            "--out", "fit-nc", "--json")
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    assert result["form"] == "kaplan_nc" and set(result["fits"]["transformer"]["params"]) == {"Nc", "alpha"}
    assert "L = (N_c/N)^α, a pure power law in Kaplan et al.'s parameterisation" in \
        (tmp_path / "fit-nc" / "report.md").read_text()
    r = toy_cli(tmp_path, "fit", "--csv", "ladder.csv", "--no-log", "--form", "kaplan")
    assert r.returncode == 2 and r.stderr == ("error: --form: expected one of [offset, pure, chinchilla, kaplan_nc], "
                                              "got 'kaplan'\n"), r.stderr
