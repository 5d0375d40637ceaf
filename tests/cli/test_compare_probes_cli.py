"""``diffsweep compare sweeps/demo-ladder.yaml --probes`` through the CLI, on a store holding
evaluation runs made here for the demo ladder's runs (nothing is trained: each run's needle and
nll_position tables are logged as ``diffsweep eval`` logs them, with known values): the layout by
size, the explicit-baseline layout, the output folder's safety (a folder of the user's is never
written into or deleted), and every bad input as one line, exit 2, nothing created or changed."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.helpers.badinput import diffsweep, refused, untouched
from tests.helpers.cli import run

LADDER = Path(__file__).resolve().parents[2] / "sweeps" / "demo-ladder.yaml"
SIZES = ("tiny-3xs", "tiny-2xs", "tiny-xs", "tiny-s", "tiny-m")
KINDS = ("transformer", "diff_v1", "diff_v2")
MISSING = "diff_v2-tiny-m"  # an arm whose evaluation failed: not in the store

# 28 evaluation runs logged once, then ~20 CLI runs in this process; one xdist group: logged by one worker
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("compare_probes_cli")]


def _nll(name: str) -> list[dict]:
    """A run's cumulative NLL: lower with size (0.3 a step) and kind (0.1 a step)."""
    shift = 0.3 * next(i for i, s in enumerate(SIZES) if f"-{s}-" in name) + 0.1 * KINDS.index(name.split("-")[0])
    return [{"position": p, "cumulative": 6.0 - shift - 0.2 * i} for i, p in enumerate((1, 2, 4, 8, 16))]


NEEDLE = [{"needles": 6, "queries": 2, "context": c, "depth": d, "samples": 5, "accuracy": 0.0}
          for c in (64, 128) for d in (0.0, 50.0, 100.0)]


@pytest.fixture(scope="module")
def ladder(tmp_path_factory, store_template) -> tuple[Path, dict[str, str]]:
    """A project folder (``proj``, the command's cwd) and the environment of a store beside it
    (``store/mlflow.db``, a copy of the session's empty store) with the ladder's evaluations:
    14 arms x 1 seed x 2 probes."""
    import shutil

    from mlflow.tracking import MlflowClient

    from diffsweep.sweep import expand, load_sweep
    from diffsweep.tracking.store import ensure_experiment

    root = tmp_path_factory.mktemp("ladder")
    (root / "store").mkdir()
    (root / "proj").mkdir()
    shutil.copyfile(store_template, root / "store" / "mlflow.db")  # migrated once per session
    uri = f"sqlite:///{root / 'store' / 'mlflow.db'}"
    spec = load_sweep(LADDER, ())
    exp = ensure_experiment(uri, spec.experiment)
    client = MlflowClient(uri)
    for arm_run in expand(spec).runs:
        if arm_run.name.startswith(MISSING):
            continue
        for probe, rows in (("needle", NEEDLE), ("nll_position", _nll(arm_run.name))):
            tags = {"diffsweep.kind": "eval", "diffsweep.eval.sweep": spec.name, "diffsweep.eval.run_key": arm_run.key,
                    "diffsweep.eval.probe": probe, "diffsweep.eval.step": "600", "diffsweep.eval.sweep_run": arm_run.name,
                    "diffsweep.eval.settings": "{}"}
            made = client.create_run(exp, run_name=f"eval {probe} {arm_run.name}", tags=tags)
            client.log_text(made.info.run_id, json.dumps(rows), f"{probe}.json")
            client.set_terminated(made.info.run_id, "FINISHED")
    return root, {"MLFLOW_TRACKING_URI": uri}


def _run(*args: str, cwd: Path, env: dict):
    """``diffsweep ARGS`` (in this process), expected to succeed; wide enough for the tables."""
    r = run(*args, cwd=cwd, env={**env, "COLUMNS": "200"})
    assert r.returncode == 0, r.stdout + r.stderr
    return r


def _comparisons(env: dict) -> int:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    exp = client.get_experiment_by_name("demo-ladder")
    return len(client.search_runs([exp.experiment_id], "tags.`diffsweep.kind` = 'comparison'"))


def test_each_size_is_compared_with_its_own_transformer(ladder, tmp_path):
    root, env = ladder
    before = _comparisons(env)
    r = _run("compare", str(LADDER), "--probes", "--json", cwd=tmp_path, env=env)
    data = json.loads(r.stdout)
    assert data["baseline"] is None and [(g["size"], g["baseline"]) for g in data["groups"]] == [
        (s, f"transformer-{s}") for s in SIZES]
    nll = [t for t in data["tables"] if t["probe"] == "nll_position"]
    assert [t["size"] for t in nll] == list(SIZES)
    for t in nll:  # three arms (two at tiny-m), each difference against its size's Transformer: -0.1, -0.2
        for cell in t["cells"]:
            assert {a["arm"].split("-")[0] for a in cell["arms"]} == (
                {"transformer", "diff_v1"} if t["size"] == "tiny-m" else set(KINDS))
            assert sorted(round(d["delta"], 9) for d in cell["differences"]) == (
                [-0.1] if t["size"] == "tiny-m" else [-0.2, -0.1])
    text = (tmp_path / "compare" / "demo-ladder-probes" / "probes.md").read_text()
    assert text.count("### size ") == 2 * len(SIZES)
    assert max(line.count("|") - 1 for line in text.splitlines() if line.startswith("|")) <= 4 + 1 + 3 + 2
    logged = __import__("mlflow").tracking.MlflowClient(env["MLFLOW_TRACKING_URI"]).get_run(data["mlflow_run_id"])
    assert logged.data.tags["diffsweep.comparison.baseline"] == ",".join(f"transformer-{s}" for s in SIZES)
    assert _comparisons(env) == before + 1

    # the terminal shows the same blocks, one per size
    r = _run("compare", str(LADDER), "--probes", "--no-log", cwd=tmp_path, env=env)
    assert "  size tiny-m: its arms against transformer-tiny-m" in r.stdout
    assert ("| position | value | transformer-tiny-m | diff_v1-tiny-m-lam_0.8 | diff_v1-tiny-m-lam_0.8 − "
            "transformer-tiny-m (95% CI) |") in r.stdout


def test_an_explicit_baseline_gives_the_one_table_of_every_arm(ladder, tmp_path):
    _, env = ladder
    r = _run("compare", str(LADDER), "--probes", "--baseline", "transformer-tiny-3xs", "--no-log", "--json",
             "--out", "all", cwd=tmp_path, env=env)
    data = json.loads(r.stdout)
    assert data["baseline"] == "transformer-tiny-3xs" and len(data["groups"]) == 1
    assert all(t["size"] is None for t in data["tables"])
    cell = next(t for t in data["tables"] if t["probe"] == "nll_position")["cells"][0]
    assert len(cell["arms"]) == 14 and len(cell["differences"]) == 13
    assert "### size" not in (tmp_path / "all" / "probes.md").read_text()


def test_out_replaces_only_a_folder_diffsweep_wrote(ladder, tmp_path):
    _, env = ladder
    out = tmp_path / "res"
    args = ("compare", str(LADDER), "--probes", "--no-log", "--out", "res")
    _run(*args, cwd=tmp_path, env=env)
    first = sorted(p.name for p in out.iterdir())
    assert first == ["needle.png", "nll_position.png", "probes.json", "probes.md"]
    _run(*args, cwd=tmp_path, env=env)  # its own folder: replaced
    assert sorted(p.name for p in out.iterdir()) == first
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary folder left
    assert oct(out.stat().st_mode & 0o777) == oct(0o777 & ~_umask())  # not mkdtemp's 0o700
    (out / "my-notes.txt").write_text("mine")  # the user adds a file: the folder is no longer only ours
    with untouched(tmp_path):
        r = diffsweep(*args, cwd=tmp_path, env=env)
    refused(r, "--out", "my-notes.txt", "did not write")
    (out / "my-notes.txt").unlink()
    empty = tmp_path / "empty"
    empty.mkdir()
    _run("compare", str(LADDER), "--probes", "--no-log", "--out", "empty", cwd=tmp_path, env=env)
    assert sorted(p.name for p in empty.iterdir()) == first


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _user_folder(root: Path) -> None:
    (root / "results").mkdir()
    (root / "results" / "paper.tex").write_text("my paper")
    (root / "results" / "probes.md").write_text("my own notes, not a comparison")
    (root / "notes.txt").write_text("mine")
    (root / "link").symlink_to(root / "results")


# (arguments after SWEEP, the words the one error line must hold)
BAD = {
    "unknown baseline arm": (["--probes", "--baseline", "transformer-tiny"], ["--baseline", "transformer-tiny-3xs"]),
    "baseline without evaluation": (["--probes", "--baseline", MISSING], ["--baseline", MISSING, "no evaluation"]),
    "level 0": (["--probes", "--level", "0"], ["--level", "[0.5, 1)"]),
    "level 1": (["--probes", "--level", "1"], ["--level", "[0.5, 1)"]),
    "level 1.5": (["--level", "1.5"], ["--level", "[0.5, 1)"]),
    "step not evaluated": (["--probes", "--step", "300"], ["--step", "[600]"]),
    "out is a user file": (["--probes", "--out", "notes.txt"], ["--out", "notes.txt", "not a folder"]),
    "out is a user folder": (["--probes", "--out", "results"], ["--out", "results", "paper.tex", "did not write"]),
    "out is a link": (["--probes", "--out", "link"], ["--out", "link", "is a link"]),
    "out inside a file": (["--probes", "--out", "notes.txt/cmp"], ["--out", "notes.txt", "not a folder"]),
    "out without --probes": (["--out", "results"], ["--out", "applies only with --probes"]),
    "no finished training run": ([], ["demo-ladder.yaml", "no finished run of sweep 'demo-ladder'"]),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_one_line_exit_2_and_touches_nothing(case, ladder, tmp_path):
    root, env = ladder
    args, needles = BAD[case]
    _user_folder(tmp_path)
    before = _comparisons(env)
    with untouched(tmp_path), untouched(root):
        r = diffsweep("compare", str(LADDER), *args, cwd=tmp_path, env=env)
    refused(r, *needles)
    assert _comparisons(env) == before  # no comparison run logged


def test_a_sweep_whose_probes_were_never_evaluated_is_one_line(ladder, tmp_path):
    root, env = ladder
    sweep = LADDER.parent / "fig3a-size-scan.yaml"  # no evaluation of it in the store
    with untouched(tmp_path), untouched(root):
        r = diffsweep("compare", str(sweep), "--probes", cwd=tmp_path, env=env)
    refused(r, "fig3a-size-scan.yaml", "no evaluation run of sweep 'fig3a-size-scan'", "diffsweep eval")
