"""Sweep commands as a user runs them with ``--set``, from other directories, and on Table 6 scaled
down from the shipped file (input that used to hang is in test_sweep_cli's bad sweeps)."""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path

import pytest

from tests.helpers.cli import run as cli
from tests.launch.conftest import TINY_SET

REPO = Path(__file__).resolve().parents[2]
TINY = [f"--set={k}={v}" for k, v in TINY_SET.items() if k != "model.size"]


def tiny_sweep(directory: Path, dataset: Path) -> Path:
    """A sweep of two tiny runs whose data path is relative to the sweep file."""
    directory.mkdir(parents=True)
    settings = {**TINY_SET, "data.path": os.path.relpath(dataset, directory), "train.max_steps": 8}
    path = directory / "t.yaml"
    path.write_text("set:\n" + "".join(f"  {k}: {v}\n" for k, v in settings.items())
                    + "grid:\n  model.attention.kind: [transformer, diff_v1]\n")
    return path


def counts(r) -> dict:
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout)["counts"]


def test_set_and_status_from_another_directory(tmp_path, text_dataset, store):
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    sweep = tiny_sweep(project / "sweeps", text_dataset)
    elsewhere.mkdir()
    r = cli("launch", "sweeps/t.yaml", "--executor", "local", "--wait", "--set", "train.max_steps=3",
            cwd=project, env=store)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "follow with: diffsweep status sweeps/t.yaml --set train.max_steps=3\n" in r.stdout
    assert (project / "sweeps" / "runs" / "t" / "ledger.json").is_file()  # the default output: beside the sweep
    entries = json.loads((project / "sweeps" / "runs" / "t" / "ledger.json").read_text())["entries"]
    assert [e["identity"]["train.max_steps"] for e in entries.values()] == [3, 3]  # trained with the --set value

    # logs finds the run in the sweep's default output (sweeps/runs/t) without being told the sweep
    name = json.loads((project / "sweeps" / "runs" / "t" / "ledger.json").read_text())["entries"]
    r = cli("logs", next(iter(name.values()))["name"], cwd=project, env=store)
    assert r.returncode == 0 and "finished 3 steps" in r.stdout, r.stdout + r.stderr
    r = cli("logs", "no-such-run", cwd=elsewhere, env=store)
    assert r.returncode == 2 and "--sweep SWEEP.yaml" in r.stderr

    # the same runs, from another directory, with the sweep named by another path
    other = os.path.relpath(sweep, elsewhere)
    assert counts(cli("status", other, "--executor", "local", "--json", "--set", "train.max_steps=3",
                      cwd=elsewhere, env=store)) == {"done": 2}
    # without the --set they are other runs (--set is part of each run's key): their names' runs changed
    r = cli("status", other, "--executor", "local", "--json", cwd=elsewhere, env=store)
    assert counts(r) == {"changed": 2} and {row["detail"] for row in json.loads(r.stdout)["runs"]} == {"train.max_steps"}
    r = cli("plan", other, "--executor", "local", "--set", "train.max_steps=3", cwd=elsewhere, env=store)
    assert r.stdout.startswith("--set in every run: train.max_steps=3\n") and "2 done" in r.stdout
    r = cli("plan", other, "--executor", "local", "--set", "train.max_steps=3", "--json", cwd=elsewhere, env=store)
    assert json.loads(r.stdout)["set"] == {"train.max_steps": 3}
    assert not (elsewhere / "runs").exists()
    # fit finds the runs by their keys: the same --set selects them (one size: too few to fit a law)
    r = cli("fit", other, "--set", "train.max_steps=3", "--no-log", cwd=elsewhere, env=store)
    assert r.returncode == 2 and "no runs match" not in r.stderr, r.stderr
    r = cli("fit", other, "--no-log", cwd=elsewhere, env=store)
    assert r.returncode == 2 and "no runs match" in r.stderr and "pass the same --set to fit" in r.stderr, r.stderr
    assert not (elsewhere / "fits").exists()


def test_a_sweep_launched_under_the_former_default_output_is_not_started_again(tmp_path, text_dataset, store):
    """Its ledger in runs/<name> of the working directory is found, not silently replaced."""
    from diffsweep.launch.ledger import Ledger, write_ledger

    sweep = tiny_sweep(tmp_path / "sweeps", text_dataset)
    (tmp_path / "runs" / "t").mkdir(parents=True)
    write_ledger(tmp_path / "runs" / "t", Ledger(sweep="t", experiment="t", tracking_uri=store["MLFLOW_TRACKING_URI"]))
    for command in ("plan", "launch", "status"):
        r = cli(command, str(sweep), "--executor", "local", cwd=tmp_path, env=store)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert f"{tmp_path / 'runs' / 't'} holds this sweep's runs" in r.stderr and "pass --out" in r.stderr
    assert not (tmp_path / "sweeps" / "runs").exists()
    assert counts(cli("status", str(sweep), "--executor", "local", "--json", "--out", "runs/t", cwd=tmp_path,
                      env=store)) == {"new": 2}


def documented_table6_command() -> tuple[dict[str, str | None], list[str]]:
    """The one-line recipe of sweeps/README.md: its options after ``diffsweep launch SWEEP``
    (``--wait`` maps to None) and its ``--set`` values."""
    text = (REPO / "sweeps" / "README.md").read_text()
    (line,) = re.findall(r"<!-- table6-small -->\n```bash\n(.*)\n```", text)
    args = shlex.split(line)
    assert args[:3] == ["diffsweep", "launch", "sweeps/table6-ablation.yaml"]
    options: dict[str, str | None] = {}
    sets: list[str] = []
    rest = args[3:]
    while rest:
        flag = rest.pop(0)
        if flag == "--set":
            sets.append(rest.pop(0))
        else:
            options[flag] = None if flag == "--wait" else rest.pop(0)
    return options, sets


def test_the_documented_table6_command_plans_seven_tiny_rows_with_three_seeds(tmp_path):
    options, sets = documented_table6_command()
    r = cli("plan", "sweeps/table6-ablation.yaml", "--executor", options["--executor"], "--out", options["--out"],
            *(f"--set={s}" for s in sets), "--json", cwd=REPO)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["out"] == str(REPO / "runs" / "table6-small") and data["executor"] == "local"
    rows = ["transformer-tiny-m-hd_16", "transformer-tiny-m-hd_32", "transformer-tiny-m-hd_32-gn_on",
            "diff_v1-tiny-m-hd_16", "diff_v1-tiny-m-hd_16-gn_off", "diff_v1-tiny-m-hd_16-lam_0.8",
            "diff_v1-tiny-m-hd_16-lam_0.5"]
    assert [(run["name"], run["size"]) for run in data["runs"]] == [
        (f"{row}-s{seed}", "tiny-m") for row in rows for seed in (0, 1, 2)]
    # The README states the count it launches.
    assert "21 runs" in (REPO / "sweeps" / "README.md").read_text()


@pytest.mark.slow
def test_table6_scaled_down_runs_from_the_shipped_file(tmp_path, text_dataset, store):
    """The documented command on the test corpus (its 512-token vocabulary), a few steps per run.
    Launched on the local queue: seed 0 of two rows (CI time), Transformer 8 x 256 + GroupNorm and
    DIFF - GroupNorm, which between them set every option the rows set but lambda_init. Every row's
    model (the two lambda_init rows included) then takes a training step here, in this process."""
    import torch

    from diffsweep.model.transformer import build_model
    from diffsweep.sweep import expand, load_sweep

    options, sets = documented_table6_command()
    options["--out"] = str(tmp_path / "t6")
    sets = [s for s in sets if not s.startswith(("model.size=", "data.path="))]  # keeps data.tokenizer=bpe
    sets += ["model.size=tiny-xs", f"data.path={text_dataset}", *(t.removeprefix("--set=") for t in TINY),
             "train.max_steps=3"]
    flags = [part for flag, value in options.items() for part in ([flag] if value is None else [flag, value])]
    r = cli("launch", str(REPO / "sweeps" / "table6-ablation.yaml"), *flags, *(f"--set={s}" for s in sets),
            "--only=-gn_o(n|ff)-s0$", cwd=tmp_path, env=store)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "launched 2 runs on the local queue" in r.stdout and "2 done" in r.stdout

    rows = [run for run in expand(load_sweep(REPO / "sweeps" / "table6-ablation.yaml", sets)).runs
            if run.name.endswith("-s0")]
    assert len(rows) == 7
    for run in rows:
        torch.manual_seed(0)
        model = build_model(run.config.model)
        tokens = torch.randint(0, run.config.model.vocab_size, (2, run.config.train.seq_len + 1))
        logits = model(tokens[:, :-1]).float()
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
        grads = [p.grad for p in model.parameters() if p.requires_grad]
        assert torch.isfinite(loss) and all(g is not None and torch.isfinite(g).all() for g in grads), run.name


def test_bad_set_on_sweep_commands(tmp_path, text_dataset):
    sweep = tiny_sweep(tmp_path / "s", text_dataset)
    cases = [(["--set", "model.attention.kind=diff_v2"], "--set: model.attention.kind is set by the grid of"),
             (["--set", "model.sise=tiny-m"], "--set: model.sise: unknown config key (did you mean 'model.size'?)"),
             (["--set", "train.seed=-1"], "train.seed: expected an integer in [0, 2**63 - 1], got -1"),
             (["--set", "model.d_model=1099511627776"], "model.d_model: 1099511627776 is over the limit")]
    for args, message in cases:
        for command in ("plan", "launch", "status", "cancel"):
            r = cli(command, str(sweep), "--executor", "local", *args, cwd=tmp_path)
            assert r.returncode == 2 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1, (
                command, r.stderr)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s"] and os.listdir(tmp_path / "s") == ["t.yaml"]
