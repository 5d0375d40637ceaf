"""What users see from a checkout, written to a folder, so that a refactor can be checked against the
commit before it (issue #31: "behaviour unchanged for users"):

    python3 analysis/golden/snapshot.py OUT [--checkout DIR]      # DIR: default, this checkout
    diff -r OUT_BEFORE OUT_AFTER                                  # identical, or every difference explained

Every command runs in a fresh process with DIR first on PYTHONPATH (the environment's packages
otherwise), in a scratch folder, with its paths replaced by ``<root>`` and ``<tmp>``:

- ``plan/<sweep>.json``: ``diffsweep plan`` of every shipped sweep on the ``h100-example`` profile
  (each run's name, key, size, tokens, GPUs, memory, time and Slurm resources), from a copy of
  sweeps/ in one fixed folder (a run's key holds its data path);
- ``sbatch.json``: the Slurm executor's parameters (the ``#SBATCH`` lines) of each resource class
  of each of those sweeps on that profile;
- ``fit/<case>.json``: ``diffsweep fit --csv`` of fixed synthetic tables (every form, objective, axis
  and option the CLI offers), bootstrap seed fixed;
- ``data.json``: the sha256 of every file ``diffsweep data prepare`` writes from a fixed corpus;
- ``train.json``: the 12-step training and validation losses of each built-in kind on that corpus
  (bitwise: the same numbers to the last digit on the same machine and torch);
- ``slurm.txt`` (``--parts slurm``, on an idle localhost Slurm cluster: ``bash slurm/start-cluster.sh``):
  the transcript of a two-run sweep on that corpus launched, cancelled, its status, relaunched to
  the end and its status again, Slurm job ids numbered in order of appearance.

Nothing is fetched; the corpus is CPython's pydoc topics (as the tests' ``text_dataset``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
PROFILE = "h100-example"
PROJECT = Path(tempfile.gettempdir()) / "diffsweep-golden-project"
TINY = ["model.size=tiny-xs", "model.vocab_size=512", "train.seq_len=32", "train.batch_tokens=128",
        "train.micro_batch_size=2", "train.max_steps=12", "train.warmup_steps=2", "train.eval_every=4",
        "train.eval_tokens=256", "train.checkpoint_every=6", "train.log_every=1"]
KINDS = ("transformer", "diff_v1", "diff_v2")


def ladder(seed: int, ratio: float = 0.62, seeds: int = 2, noise: float = 0.004) -> list[dict]:
    """Loss of an offset law L = E + A N^-α per size and seed, the candidate at N/ratio."""
    rng = np.random.default_rng(seed)
    rows = []
    for arch, rho in (("transformer", 1.0), ("diff_v1", ratio)):
        for n in np.geomspace(8.3e8, 1.31e10, 5):
            for s in range(seeds):
                loss = (1.7 + 400.0 * (n / rho) ** -0.3) * np.exp(rng.normal(0, noise))
                rows.append({"arch": arch, "num_params": n, "tokens": 2e10, "loss": loss, "seed": s,
                             "run_name": f"{arch}-{n:.3g}-s{s}"})
    return rows


def token_scan(seed: int) -> list[dict]:
    """Loss against tokens at one size (a token scan), the candidate reaching it with 0.7x the tokens."""
    rng = np.random.default_rng(seed)
    return [{"arch": arch, "num_params": 3e9, "tokens": d, "loss": (1.8 + 2000.0 * (d / rho) ** -0.28)
             * np.exp(rng.normal(0, 0.003)), "seed": 0, "run_name": f"{arch}-{d:.3g}"}
            for arch, rho in (("transformer", 1.0), ("diff_v1", 0.7)) for d in np.geomspace(2e10, 4e11, 6)]


def chinchilla(seed: int) -> list[dict]:
    """L(N, D) = E + A/N^α + B/D^β on a grid of sizes and token budgets."""
    rng = np.random.default_rng(seed)
    return [{"arch": arch, "num_params": n, "tokens": d, "loss": (1.69 + 406.4 * (n / rho) ** -0.34
                                                                 + 410.7 * d ** -0.28) * np.exp(rng.normal(0, 0.003)),
             "seed": 0, "run_name": f"{arch}-{n:.3g}-{d:.3g}"}
            for arch, rho in (("transformer", 1.0), ("diff_v1", 0.65))
            for n in np.geomspace(4e8, 8e9, 4) for d in np.geomspace(8e9, 3e11, 4)]


# name: (table, options); --boot 200 and --seed 7 for every case
FIT_CASES: dict[str, tuple[list[dict], list[str]]] = {
    "offset": (ladder(1), []),
    "offset-huber": (ladder(2), ["--objective", "huber"]),
    "offset-shared-e": (ladder(3), ["--shared-e"]),
    "offset-level-90": (ladder(4), ["--level", "0.9"]),
    "offset-holdout": (ladder(5), ["--holdout", "largest"]),
    "offset-at": (ladder(6), ["--at", "20B", "--at", "3B"]),
    "offset-one-seed": (ladder(7, seeds=1), []),
    "offset-noise-sd": (ladder(8), ["--noise-sd", "0.004"]),
    "pure": (ladder(9), ["--form", "pure"]),
    "pure-huber": (ladder(10), ["--form", "pure", "--objective", "huber"]),
    "tokens": (token_scan(11), ["--axis", "D"]),
    "tokens-pure": (token_scan(12), ["--axis", "D", "--form", "pure"]),
    "chinchilla": (chinchilla(13), ["--form", "chinchilla"]),
    "chinchilla-l2": (chinchilla(14), ["--form", "chinchilla", "--objective", "l2"]),
    "chinchilla-mle": (chinchilla(15), ["--form", "chinchilla", "--objective", "huber_mle"]),
}


def run(checkout: Path, cwd: Path, *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(checkout), os.environ.get("PYTHONPATH")])),
           "MLFLOW_TRACKING_URI": f"sqlite:///{cwd / 'mlflow.db'}", "OMP_NUM_THREADS": "1", "COLUMNS": "200"}
    done = subprocess.run([sys.executable, "-m", "diffsweep", *args], cwd=cwd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"diffsweep {' '.join(args)}: exit {done.returncode}\n{done.stderr[-3000:]}")
    return done.stdout


def scrub(text: str, checkout: Path, tmp: Path) -> str:
    text = text.replace(str(checkout.resolve()), "<root>").replace(str(tmp.resolve()), "<tmp>")
    return re.sub(r'"(created|finished|started|time|timestamp|date|elapsed_s|seconds)": [^,\n}]+', r'"\1": "<t>"', text)


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text if text.endswith("\n") else text + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--checkout", type=Path, default=ROOT)
    parser.add_argument("--parts", default="plan,fit,train", help="plan, fit, train (data and train.json), slurm")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    checkout, out = args.checkout.resolve(), args.out
    with tempfile.TemporaryDirectory(prefix="golden-") as name:
        tmp = Path(name)
        # a run's key holds its data path, which the shipped sweeps give relative to sweeps/: the same
        # project folder for every checkout, so that keys compare
        shutil.rmtree(PROJECT, ignore_errors=True)
        shutil.copytree(checkout / "sweeps", PROJECT / "sweeps")
        for sweep in sorted((PROJECT / "sweeps").glob("*.yaml")) if "plan" in parts else ():
            text = run(checkout, PROJECT, "plan", str(sweep), "--profile", PROFILE, "--json")
            write(out / "plan" / f"{sweep.stem}.json", scrub(text, checkout, tmp))
        if "plan" in parts:
            write(out / "sbatch.json", _sbatch(checkout, sorted((PROJECT / "sweeps").glob("*.yaml"))))  # no paths
        shutil.rmtree(PROJECT)
        for case, (rows, options) in FIT_CASES.items() if "fit" in parts else ():
            table = tmp / f"{case}.csv"
            table.write_text("arch,num_params,tokens,loss,seed,run_name\n" + "".join(
                f"{r['arch']},{float(r['num_params'])!r},{float(r['tokens'])!r},{float(r['loss'])!r},{r['seed']},"
                f"{r['run_name']}\n"
                for r in rows))
            text = run(checkout, tmp, "fit", "--csv", str(table), "--no-log", "--boot", "200", "--seed", "7", "--json",
                       "--out", str(tmp / f"fit-{case}"), *options)
            write(out / "fit" / f"{case}.json", scrub(text, checkout, tmp))
        if not parts & {"train", "slurm"}:
            print(f"wrote {out}")
            return
        import pydoc_data.topics

        corpus = tmp / "corpus"
        corpus.mkdir()
        for i, (key, text) in enumerate(sorted(pydoc_data.topics.topics.items())):
            (corpus / f"{i:03d}-{key}.txt").write_text(text)
        run(checkout, tmp, "data", "prepare", str(corpus), "--out", str(tmp / "data"), "--vocab-size", "512",
            "--workers", "1")
        sums = {str(p.relative_to(tmp / "data")): hashlib.sha256(p.read_bytes()).hexdigest()
                for p in sorted((tmp / "data").rglob("*")) if p.is_file() and p.name != "meta.json"}
        meta = json.loads((tmp / "data" / "meta.json").read_text())
        write(out / "data.json", scrub(json.dumps({"files": sums, "meta": meta}, indent=1, sort_keys=True), checkout,
                                       tmp))
        losses = {}
        for kind in KINDS if "train" in parts else ():
            run(checkout, tmp, "train", "--arch", kind, "--out", str(tmp / "runs"), "--experiment", "golden",
                *(a for s in [*TINY, f"data.path={tmp / 'data'}"] for a in ("--set", s)))
            losses[kind] = _losses(checkout, tmp, kind)
        if "train" in parts:
            write(out / "train.json", json.dumps(losses, indent=1))
        if "slurm" in parts:
            write(out / "slurm.txt", _slurm_transcript(checkout, tmp))
    print(f"wrote {out}")


def _slurm_transcript(checkout: Path, tmp: Path) -> str:
    """launch, cancel, status, launch --wait, status of a two-run sweep on the localhost cluster."""
    queue = subprocess.run(["squeue", "-h"], capture_output=True, text=True) if shutil.which("squeue") else None
    if queue is None or queue.returncode != 0:
        raise SystemExit("--parts slurm: no reachable Slurm controller (bash slurm/start-cluster.sh && "
                         "source /tmp/diffsweep-slurm/env.sh)")
    if queue.stdout.strip():
        raise SystemExit("--parts slurm: the cluster is not idle (squeue lists jobs); wait or scancel them")
    project = tmp / "slurm"
    project.mkdir()
    sweep = project / "t.yaml"
    settings = [s.split("=", 1) for s in TINY]
    sweep.write_text("name: golden\nset:\n" + "".join(f"  {k}: {v}\n" for k, v in settings)
                     + f"  data.path: {tmp / 'data'}\ngrid:\n  model.attention.kind: [transformer, diff_v1]\n")
    profile = ("--profile", "localhost")
    steps = [("launch", str(sweep), *profile), ("cancel", str(sweep), *profile)]
    lines = []
    for args in steps:
        lines += [f"$ diffsweep {' '.join(args)}", run(checkout, project, *args)]
    deadline = time.monotonic() + 180
    while json.loads(run(checkout, project, "status", str(sweep), *profile, "--json"))["counts"] != {"cancelled": 2}:
        if time.monotonic() > deadline:
            raise SystemExit("--parts slurm: the cancelled runs did not show as cancelled within 180 s")
        time.sleep(1)
    for args in [("status", str(sweep), *profile), ("launch", str(sweep), *profile, "--wait"),
                 ("status", str(sweep), *profile)]:
        lines += [f"$ diffsweep {' '.join(args)}", run(checkout, project, *args)]
    text = scrub("\n".join(lines), checkout, tmp)
    jobs, ids = _job_ids(project), {}
    text = re.sub(r"\b\d+(?=_\d|\b)", lambda m: ids.setdefault(m.group(), f"<job{len(ids) + 1}>")
                  if m.group() in jobs else m.group(), text)
    text = re.sub(r"\b[0-9a-f]{12}\b", "<key>", text)  # a run's key holds its data path, in a new folder each time
    # --wait's progress lines before a run ends depend on when its polls fall: only the ends are kept
    lines = [line for line in text.splitlines() if not re.search(r"pending|-> running|ETA|starting| left$", line)]
    ends = iter(sorted(line for line in lines if "-> done" in line))  # two runs ending in one poll: either order
    text = "\n".join(next(ends) if "-> done" in line else line for line in lines)
    return re.sub(r"\b\d+(\.\d+)? ?(s|min|h)\b|\b\d+:\d\d(:\d\d)?\b", "<t>", text)


def _job_ids(project: Path) -> set[str]:
    """Every Slurm job id in the sweep's ledgers (array ids without their task suffix)."""
    found = set()
    for path in project.rglob("ledger.json"):
        for entry in json.loads(path.read_text())["entries"].values():
            found |= {str(a["job_id"]).split("_")[0] for a in entry["attempts"] if a.get("job_id")}
    return found


# Each resource class of each shipped sweep on PROFILE, as the Slurm executor's parameters (what
# becomes the #SBATCH lines); written for this checkout's API and the one before profile_choice.
_SBATCH = """
import inspect, json, sys
from pathlib import Path
from diffsweep.launch import resources as R
from diffsweep.sweep import expand, load_sweep
try:
    from diffsweep.launch.profile_choice import load_profile
except ImportError:
    from diffsweep.launch.profiles import load_profile
profile = load_profile(sys.argv[1])
kw = {"reserves": True} if "reserves" in inspect.signature(R.estimate_resources).parameters else {}
out = {}
for path in map(Path, sys.argv[2:]):
    spec = load_sweep(path)
    classes = {repr(e.resources): e.resources for e in (R.estimate_resources(run, profile, spec.launch.gpus_per_run, **kw)
                                                       for run in expand(spec).runs)}
    out[path.stem] = [R.slurm_parameters(r, profile, job_name=spec.name, code_dir="<code>", max_parallel=None)
                      for _, r in sorted(classes.items())]
print(json.dumps(out, indent=1, sort_keys=True, default=str))
"""


def _sbatch(checkout: Path, sweeps: list[Path]) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(checkout), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", _SBATCH, PROFILE, *map(str, sweeps)], cwd=PROJECT, env=env,
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"sbatch parameters: exit {done.returncode}\n{done.stderr[-3000:]}")
    return done.stdout


def _losses(checkout: Path, tmp: Path, kind: str) -> dict[str, list[float]]:
    """The run's logged train/loss and val/loss by step, read back from its MLflow store."""
    code = ("import json, sys\nfrom mlflow.tracking import MlflowClient\n"
            "c = MlflowClient(sys.argv[1])\nexp = c.get_experiment_by_name('golden')\n"
            "run = [r for r in c.search_runs([exp.experiment_id]) if r.data.params.get('model.attention.kind', "
            "r.data.tags.get('diffsweep.arch')) == sys.argv[2] or sys.argv[2] in r.info.run_name][0]\n"
            "print(json.dumps({m: [h.value for h in sorted(c.get_metric_history(run.info.run_id, m), "
            "key=lambda h: h.step)] for m in ('train/loss', 'val/loss')}))")
    done = subprocess.run([sys.executable, "-c", code, f"sqlite:///{tmp / 'mlflow.db'}", kind], capture_output=True,
                          text=True, check=True)
    return json.loads(done.stdout)


if __name__ == "__main__":
    main()
