"""Every command example in README.md and docs/*.md is run by a test.

Each line of a ```bash block, in any of those pages, is looked up in CHECKS (a command shown on
several pages has one entry). Most run exactly as written. A few cannot run
here as written (a 10-minute CPU training job, a Slurm cluster, a GPU, the network, a user's own
files); those run in a checked cheap form that exercises the same command, options and inputs, and
CHECKS says why for each. An example without an entry fails ``test_every_readme_command_is_checked``.
The pages' links to each other (files and #anchors) are checked too, and so is the rule that no file
of the repository points outside it, to the notes in a sibling ``shared`` folder.

The fit examples run for real against an MLflow store holding runs of the README's own sweeps, logged
the way ``diffsweep train`` logs them (the same tags, params, run keys and metric names); only their
losses are synthetic (a known curve), because training 13.1B models is not a test.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.cli import run as cli
from tests.scaling.synthetic import log_runs

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]


def page_commands(page: Path) -> list[str]:
    """The commands of a page's ```bash blocks, comments and blank lines dropped."""
    out, inside = [], False
    for line in page.read_text().splitlines():
        if line.strip().startswith("```"):  # fences indented in a list too
            inside = line.strip() == "```bash"
            continue
        command = line.split(" # ")[0].split("  #")[0].strip()
        if inside and command and not command.startswith("#"):
            out.append(command)
    return out


def readme_commands() -> list[str]:
    """The commands of README.md and every docs/*.md page, in that order."""
    return [c for page in PAGES for c in page_commands(page)]


# How each README command is checked: ("run", args) runs ``diffsweep ARGS`` (or ``python -m ...``)
# as written; ("cheap", args, why) runs a checked stand-in; ("fit", args) runs a fit example
# against the store of synthetic runs; ("steps", why) names a chain whose steps are checked each.
HELP = "--help"
EVAL_WHY = ("runs/my-run is the user's trained run; tests/eval/test_runner.py runs these commands on a trained "
            "tiny run")
CHECKS: dict[str, tuple] = {
    # the quick start: a chain of steps, each of which appears (and is checked) on its own below
    "python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 -e . && diffsweep data fetch-demo "
    "&& diffsweep data prepare --demo --force && diffsweep launch sweeps/demo-ladder.yaml --executor local --wait "
    "&& diffsweep fit sweeps/demo-ladder.yaml --holdout largest":
        ("steps", ("venv + pip are the environment this test runs in; fetch-demo, prepare, launch and fit are "
                  "checked by their own entries (fit sweeps/demo-ladder.yaml --holdout largest runs for real)")),
    "python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 -e '.[test]' && diffsweep data "
    "fetch-demo && python -m pytest -n 4 --dist loadgroup --durations=25":
        ("steps", "the environment this test runs in and the test suite this test is part of"),
    "diffsweep model sizes": ("run", ["model", "sizes"]),
    "diffsweep ui": ("cheap", ["ui", HELP], "it serves the MLflow UI until Ctrl-C"),
    "diffsweep model info --size 1.4B --arch diff_v1": ("run", ["model", "info", "--size", "1.4B", "--arch", "diff_v1"]),
    "diffsweep model info --size 1.4B --arch diff_v2 --json":
        ("run", ["model", "info", "--size", "1.4B", "--arch", "diff_v2", "--json"]),
    "diffsweep model compare --size 13.1B": ("run", ["model", "compare", "--size", "13.1B"]),
    "diffsweep config show sweeps/runs/paper-1.4B-diff_v1.yaml --set model.attention.lambda_init=constant:0.8":
        ("run", ["config", "show", "sweeps/runs/paper-1.4B-diff_v1.yaml", "--set",
                 "model.attention.lambda_init=constant:0.8"]),
    "python -m diffsweep --help": ("run", [HELP]),
    "diffsweep data fetch-demo": ("cheap", ["data", "fetch-demo", HELP], "it downloads (pip + apt): the network"),
    "diffsweep data prepare web/ --out data/web --tokenizer cl100k_base --shard-size 1G --launch --profile "
    "h100-example":
        ("cheap", ["data", "prepare", "web/", "--out", "data/web", "--launch", "--profile", "h100-example", HELP],
         ("it submits a job array to a GPU cluster; tests/launch/test_prepare_launch.py launches one for real, "
          "locally and on the localhost Slurm cluster")),
    "diffsweep data status data/web": ("cheap", ["data", "status", "data/web", HELP],
                                       "needs a launched prepare (tests/launch/test_prepare_launch.py runs it)"),
    "diffsweep data logs data/web --task 3": ("cheap", ["data", "logs", "data/web", "--task", "3", HELP],
                                              "needs a launched prepare (tests/launch/test_prepare_launch.py runs it)"),
    "diffsweep data cancel data/web": ("cheap", ["data", "cancel", "data/web", HELP],
                                       "needs a launched prepare (tests/launch/test_prepare_launch.py runs it)"),
    ("diffsweep data prepare fineweb-edu/sample/100BT --out data/pretrain-cl100k --tokenizer cl100k_base "
     "--val-split document --max-tokens 11000000000"):
        ("cheap", ["data", "prepare", "fineweb-edu/sample/100BT", "--out", "data/pretrain-cl100k", "--tokenizer",
                   "cl100k_base", "--val-split", "document", "--max-tokens", "11000000000", HELP],
         ("fineweb-edu/ is a downloaded corpus (the network, hundreds of GB); tests/data/test_shards.py prepares "
          "Parquet and JSONL with workers, --max-tokens and --val-split document")),
    ("diffsweep data prepare fineweb-edu/sample/100BT --out data/pretrain-cl100k --tokenizer cl100k_base "
     "--val-split document --max-tokens 11000000000 --launch --profile my-cluster"):
        ("cheap", ["data", "prepare", "fineweb-edu/sample/100BT", "--out", "data/pretrain-cl100k", "--launch",
                   "--profile", "my-cluster", HELP],
         ("my-cluster is the user's profile; tests/launch/test_prepare_launch.py launches a prepare locally and on "
          "the localhost Slurm cluster")),
    "diffsweep data status data/pretrain-cl100k": ("cheap", ["data", "status", "data/pretrain-cl100k", HELP],
                                                   "needs a launched prepare (tests/launch/test_prepare_launch.py)"),
    "diffsweep data verify data/pretrain-cl100k": ("cheap", ["data", "verify", "data/pretrain-cl100k", HELP],
                                                   ("needs the prepared corpus; tests/data/test_verify.py verifies "
                                                    "datasets, sound and damaged")),
    "diffsweep doctor --profile my-cluster": ("cheap", ["doctor", "--profile", "my-cluster", HELP],
                                              ("my-cluster is the user's cluster; tests/launch/test_doctor.py runs "
                                               "doctor on the localhost Slurm cluster")),
    "diffsweep doctor --profile my-cluster --preempt": ("cheap", ["doctor", "--profile", "my-cluster", "--preempt",
                                                                  HELP],
                                                        ("my-cluster is the user's cluster; tests/launch/test_doctor.py "
                                                         "runs doctor --preempt on the localhost Slurm cluster")),
    "diffsweep server": ("cheap", ["server", HELP], ("it serves until Ctrl-C; tests/launch/test_server.py starts "
                                                     "it, logs 16 processes through it and a Slurm sweep")),
    "diffsweep data prepare --demo": ("cheap", ["data", "prepare", "--demo", HELP],
                                      "it needs the fetched demo sources (the network)"),
    "diffsweep data prepare my_texts/ --out data/mine --tokenizer cl100k_base":
        ("cheap", ["data", "prepare", "my_texts/", "--out", "data/mine", "--tokenizer", "cl100k_base", HELP],
         "my_texts/ is the user's own folder, and cl100k_base downloads its vocabulary"),
    "diffsweep data prepare web/*.jsonl.zst --out data/web --tokenizer cl100k_base --max-tokens 100000000":
        ("cheap", ["data", "prepare", "web/x.jsonl.zst", "--out", "data/web", "--tokenizer", "cl100k_base",
                   "--max-tokens", "100000000", HELP],
         ("web/ is the user's own corpus; tests/data/test_sources.py prepares every format (.zst included) "
          "and checks --max-tokens")),
    ("diffsweep data prepare HuggingFaceFW/fineweb-edu --config sample-10BT --out data/fineweb --tokenizer "
     "cl100k_base --sample 0.1"):
        ("cheap", ["data", "prepare", "HuggingFaceFW/fineweb-edu", "--config", "sample-10BT", "--out", "data/fineweb",
                   "--tokenizer", "cl100k_base", "--sample", "0.1", HELP],
         ("the dataset must be in the Hugging Face cache (the network); tests/data/test_sources.py prepares a "
          "saved Hugging Face dataset and checks --sample and the not-cached error")),
    "diffsweep data info data/demo": ("data-info", ("data/demo is made by the network-fetched demo sources: the "
                                                   "same command on a dataset prepared from local text")),
    "diffsweep train sweeps/runs/demo-diff_v1.yaml --set train.max_steps=100":
        ("cheap", ["config", "show", "sweeps/runs/demo-diff_v1.yaml", "--set", "train.max_steps=100"],
         "training needs data/demo (the network); config show resolves and validates the same config and --set"),
    "torchrun --nproc-per-node 8 -m diffsweep train my-run.yaml --set train.parallel=fsdp":
        ("cheap", ["config", "show", "sweeps/runs/tiny-diff_v2.yaml", "--set", "train.parallel=fsdp"],
         "8 GPUs; my-run.yaml is the user's own config: a shipped one takes the same --set"),
    "diffsweep plan sweeps/table6-ablation.yaml": ("run", ["plan", "sweeps/table6-ablation.yaml"]),
    "diffsweep plan sweeps/diff-versions.yaml": ("run", ["plan", "sweeps/diff-versions.yaml"]),
    "diffsweep plan sweeps/demo-ladder.yaml --json": ("run", ["plan", "sweeps/demo-ladder.yaml", "--json"]),
    "diffsweep launch sweeps/diff-versions.yaml --profile my-cluster --strict":
        ("cheap", ["launch", "sweeps/diff-versions.yaml", "--strict", HELP],
         ("my-cluster is the user's profile; tests/sweep/test_audit.py runs launch --strict for real (a mismatched "
          "sweep refused, a matched one let through)")),
    "diffsweep plan sweeps/fig3a-size-scan.yaml --json": ("run", ["plan", "sweeps/fig3a-size-scan.yaml", "--json"]),
    "diffsweep plan sweeps/fig3a-size-scan.yaml --profile h100-example":
        ("run", ["plan", "sweeps/fig3a-size-scan.yaml", "--profile", "h100-example"]),
    ("diffsweep launch sweeps/table6-ablation.yaml --executor local --max-parallel 2 --out runs/table6-small --wait "
     "--set model.size=tiny-m --set data.path=data/demo --set data.tokenizer=bpe --set train.max_steps=100"):
        ("cheap", ["plan", "sweeps/table6-ablation.yaml", "--executor", "local", "--out", "runs/table6-small",
                   "--set", "model.size=tiny-m", "--set", "data.path=data/demo", "--set", "data.tokenizer=bpe",
                   "--set", "train.max_steps=100"],
         "21 CPU training runs on the demo data (the network): plan expands and validates the same runs"),
    "diffsweep launch sweeps/demo-tuned.yaml --executor local --wait":
        ("cheap", ["plan", "sweeps/demo-tuned.yaml", "--executor", "local"],
         "minutes of CPU training on the demo data (the network): plan expands and validates the same runs"),
    "diffsweep fit sweeps/demo-tuned.yaml": ("fit", ["sweeps/demo-tuned.yaml"]),
    "diffsweep launch sweeps/demo-branches.yaml --executor local --wait":
        ("cheap", ["plan", "sweeps/demo-branches.yaml", "--executor", "local"],
         ("minutes of CPU training on the demo data (the network): plan expands and validates the same runs; "
          "tests/launch/test_branches_launch.py launches branches locally, test_slurm_branches.py on Slurm")),
    "diffsweep fit sweeps/demo-branches.yaml": ("fit", ["sweeps/demo-branches.yaml"]),
    "diffsweep launch sweeps/demo-ladder.yaml --executor local --wait":
        ("cheap", ["plan", "sweeps/demo-ladder.yaml", "--executor", "local"],
         "about 10 minutes of CPU training on the demo data (the network): plan expands and validates the same runs"),
    "diffsweep launch sweeps/table6-ablation.yaml --profile my-cluster --budget 600":
        ("cheap", ["plan", "sweeps/table6-ablation.yaml", "--profile", "h100-example", "--budget", "600"],
         "Slurm; my-cluster is the user's own profile (h100-example stands in)"),
    "diffsweep status sweeps/table6-ablation.yaml": ("run", ["status", "sweeps/table6-ablation.yaml"]),
    "diffsweep eval sweeps/table6-ablation.yaml --probe outliers --probe quantization":
        ("cheap", ["eval", "sweeps/table6-ablation.yaml", "--probe", "outliers", "--probe", "quantization", HELP],
         "it needs the sweep's trained 1.4B checkpoints; tests/eval/test_sweep_eval_section.py evaluates a launched tiny sweep"),
    ("diffsweep train --set train.schedule=wsd --set train.max_steps=12000 --set train.decay_fraction=0.2 "
     "--branch-from runs/PARENT/checkpoints/step_00009600"):
        ("cheap", ["train", "--branch-from", "x", HELP],
         ("runs/PARENT is the user's WSD run; tests/train/test_branch.py branches tiny runs from a parent's checkpoint "
         "in process and on the command line")),
    "diffsweep compare sweeps/diff-v2-blog.yaml":
        ("cheap", ["compare", "sweeps/diff-v2-blog.yaml", HELP],
         ("it needs the sweep's trained 1.4B runs; tests/cli/test_compare_tuned_cli.py compares a tuned sweep's "
          "finished runs in a real MLflow store")),
    "diffsweep compare sweeps/diff-v2-blog.yaml --plot diff-v2-blog-lr.png":
        ("cheap", ["compare", "sweeps/diff-v2-blog.yaml", "--plot", "diff-v2-blog-lr.png", HELP],
         ("it needs the sweep's trained 1.4B runs; tests/cli/test_compare_tuned_cli.py draws a tuned sweep's "
          "plot from a real MLflow store")),
    "diffsweep compare sweeps/table6-ablation.yaml --probes":
        ("cheap", ["compare", "sweeps/table6-ablation.yaml", "--probes", HELP],
         "it needs the sweep's evaluations; tests/eval/test_probe_tables.py runs it on a launched, evaluated tiny sweep"),
    "diffsweep logs diff_v1-1.4B-hd_128-s0 --follow": ("cheap", ["logs", "diff_v1-1.4B-hd_128-s0", "--follow", HELP],
                                                       "it follows the log of a run launched on a cluster"),
    "diffsweep cancel sweeps/table6-ablation.yaml --only 'lam_0'":
        ("cheap", ["cancel", "sweeps/table6-ablation.yaml", "--only", "lam_0", HELP],
         "it cancels Slurm jobs of a launched sweep"),
    "diffsweep launch sweeps/table6-ablation.yaml --profile h100-example --slurm account=proj2 --slurm time=12:00:00":
        ("cheap", ["plan", "sweeps/table6-ablation.yaml", "--profile", "h100-example", "--slurm", "account=proj2",
                   "--slurm", "time=12:00:00"], "Slurm: plan resolves the same profile and overrides"),
    "diffsweep fit sweeps/fig3a-size-scan.yaml": ("fit", ["sweeps/fig3a-size-scan.yaml"]),
    "diffsweep fit --experiment fig3a-size-scan --where train.seed=0 --at 11B --holdout largest":
        ("fit", ["--experiment", "fig3a-size-scan", "--where", "train.seed=0", "--at", "11B", "--holdout", "largest"]),
    "diffsweep fit sweeps/fig3b-token-scan.yaml": ("fit", ["sweeps/fig3b-token-scan.yaml"]),
    "diffsweep fit --csv fits/fig3a-size-scan-N/points.csv": ("fit", ["--csv", "fits/fig3a-size-scan-N/points.csv"]),
    "diffsweep fit ... --form chinchilla | --form pure | --shared-e | --count non_embedding | --json":
        ("fit-options", "a list of options, each run on the fig3a runs (chinchilla on an N x D grid)"),
    "diffsweep fit sweeps/demo-ladder.yaml --holdout largest": ("fit", ["sweeps/demo-ladder.yaml", "--holdout", "largest"]),
    "diffsweep suggest fits/fig3a-size-scan-N": ("suggest", ["fits/fig3a-size-scan-N"]),
    "diffsweep suggest sweeps/fig3a-size-scan.yaml": ("suggest", ["sweeps/fig3a-size-scan.yaml"]),
    "diffsweep suggest fits/fig3a-size-scan-N --at 11B --sizes 20B,30B --budget 5000 --json":
        ("suggest", ["fits/fig3a-size-scan-N", "--at", "11B", "--sizes", "20B,30B", "--budget", "5000", "--json"]),
    "diffsweep suggest sweeps/fig3a-size-scan.yaml --budget 30000":
        ("suggest", ["sweeps/fig3a-size-scan.yaml", "--budget", "30000"]),
    "diffsweep compare sweeps/table6-ablation.yaml --baseline diff_v1-1.4B-hd_128":
        ("compare", "runs for real against a store of the sweep's 21 runs with Table 6's losses plus seed noise"),
    "python -m diffsweep_kernels.compile_report --dtype bf16 --qk-dim 128 --v-dim 256":
        ("module-help", "diffsweep_kernels.compile_report", "a GPU compiles the kernels"),
    "diffsweep bench attention --json --out attention.json":
        ("cheap", ["bench", "attention", "--json", "--out", "attention.json", HELP], "timings on a GPU"),
    "diffsweep bench model --size 1.4B --seq 2048 --micro-batch 4":
        ("cheap", ["bench", "model", "--size", "1.4B", "--seq", "2048", "--micro-batch", "4", HELP], "a 1.4B model on a GPU"),
    "diffsweep bench attention": ("cheap", ["bench", "attention", HELP], "minutes of CPU timing"),
    # evaluation: on the shipped sweeps (no run has trained here: every run is listed as not finished,
    # after the probes are checked against every run), and on a user's run (tests/eval run these
    # commands on a trained tiny run)
    ("diffsweep eval sweeps/demo-ladder.yaml --probe outliers --probe quantization --probe nll_position --probe "
     "needle --probe attention_focus"):
        ("run", ["eval", "sweeps/demo-ladder.yaml", "--probe", "outliers", "--probe", "quantization", "--probe",
                 "nll_position", "--probe", "needle", "--probe", "attention_focus"]),
    "diffsweep eval sweeps/demo-ladder.yaml --probe outliers --probe nll_position":
        ("run", ["eval", "sweeps/demo-ladder.yaml", "--probe", "outliers", "--probe", "nll_position"]),
    "diffsweep eval runs/my-run --probe outliers --probe needle":
        ("cheap", ["eval", "runs/my-run", "--probe", "outliers", "--probe", "needle", HELP], EVAL_WHY),
    "diffsweep eval runs/my-run/checkpoints/step_00004000 --probe quantization":
        ("cheap", ["eval", "runs/my-run/checkpoints/step_00004000", "--probe", "quantization", HELP], EVAL_WHY),
    'diffsweep eval runs/my-run --probe needle --probe-set needle.samples=10 --probe-set "needle.depths=[0, 50, 100]"':
        ("cheap", ["eval", "runs/my-run", "--probe", "needle", "--probe-set", "needle.samples=10", "--probe-set",
                   "needle.depths=[0, 50, 100]", HELP], EVAL_WHY),
    "diffsweep eval runs/my-run --probe outliers --json":
        ("cheap", ["eval", "runs/my-run", "--probe", "outliers", "--json", HELP], EVAL_WHY),
    "diffsweep eval sweeps/x.yaml --probe needle --launch --profile h100-example --wait":
        ("cheap", ["eval", "sweeps/x.yaml", "--probe", "needle", "--launch", "--profile", "h100-example", "--wait", HELP],
         ("Slurm jobs of the user's sweep; tests/eval/test_sweep_eval_section.py runs --launch --wait on the "
          "localhost Slurm cluster and the local queue")),
    "diffsweep compare sweeps/demo-ladder.yaml --probes":
        ("cheap", ["compare", "sweeps/demo-ladder.yaml", "--probes", HELP],
         ("it needs the demo ladder trained and evaluated (the network, ~25 minutes); "
          "tests/eval/test_probe_tables.py runs it on a launched, evaluated tiny sweep")),
    "diffsweep compare sweeps/demo-ladder.yaml --probes --only tiny-m --out compare/ladder-tiny-m":
        ("cheap", ["compare", "sweeps/demo-ladder.yaml", "--probes", "--only", "tiny-m", "--out", "compare/ladder-tiny-m",
                   HELP],
         ("it needs the demo ladder trained and evaluated; tests/eval/test_probe_tables.py runs compare --probes "
          "--only on a launched, evaluated tiny sweep")),
    "diffsweep bench model": ("cheap", ["bench", "model", HELP], "minutes of CPU timing"),
    # The device kit (docs/kernels.md): run by the named test, which says how.
    "python3 analysis/gpu/prepare.py":
        ("elsewhere", "tests/test_gpu_kit.py::test_prepare_checks_the_wheels_offline_and_prints_the_command",
         "it downloads from PyPI: .ci/run runs it during set-up, the test runs it --offline"),
    "python3 analysis/gpu/run.py --device cpu --out /tmp/kit":
        ("elsewhere", "tests/test_gpu_kit.py::test_the_cpu_rehearsal_runs_every_stage_from_a_fresh_checkout",
         "the rehearsal, run from a fresh copy of the checkout"),
    'PYTHONUNBUFFERED=1 python3 analysis/gpu/run.py --out "$OUT" --budget 450':
        ("elsewhere", "tests/test_gpu_kit.py::test_prepare_checks_the_wheels_offline_and_prints_the_command",
         "it needs the GPU machine; the test checks that prepare.py prints this very command"),
    "python3 analysis/gpu/profile_step.py transformer sdpa --table":
        ("elsewhere", "tests/test_gpu_kit.py::test_profile_step_times_every_phase_and_lists_the_top_kernels",
         "a 1.4B step needs the GPU machine; the test runs the same script at tiny-3xs on the CPU"),
    "python3 analysis/gpu/profile_step.py diff_v1 triton model.ffn_hidden=5632":
        ("elsewhere", "tests/test_gpu_kit.py::test_profile_step_times_every_phase_and_lists_the_top_kernels",
         "a 1.4B step and the triton backend need the GPU machine; the test runs the script at tiny-3xs on the CPU"),
}


def test_every_readme_command_is_checked():
    commands = readme_commands()
    missing = [c for c in commands if c not in CHECKS]
    assert not missing, f"README/docs commands without a check in {__file__}: {missing}"
    chained = " && ".join(c for c in commands if CHECKS.get(c, ("",))[0] == "steps")
    stale = [c for c in CHECKS if c not in commands and c not in chained]
    assert not stale, f"checks of commands no longer in the README or docs: {stale}"


def test_readme_gives_the_two_setup_commands():
    """The main job on embedded defaults and the test command, each right after its marker (.ci/run
    reads the test command from there)."""
    text = README.read_text()
    steps = [c for c, check in CHECKS.items() if check[0] == "steps"]
    assert len(steps) == 2
    for marker, command in zip(("<!-- main-command -->", "<!-- test-command -->"), steps):
        assert f"{marker}\n```bash\n{command}\n```" in text, marker


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_doc_links_resolve():
    """Every relative link between the pages names a file that exists and, with #, a heading in it."""
    anchors = {}
    for page in PAGES:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)
        anchors[page.resolve()] = {_anchor(h) for h in re.findall(r"^#+ (.*)$", text, flags=re.MULTILINE)}
    bad = []
    for page in PAGES:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if re.match(r"[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            path = (page.parent / file).resolve() if file else page.resolve()
            if not path.exists() or (anchor and anchor not in anchors.get(path, set())):
                bad.append(f"{page.name}: {target}")
    assert not bad, bad


def test_repository_paths_the_pages_name_exist():
    """A path of this repository a page names in backticks (``tests/...py``, ``diffsweep/...py``, ...)
    exists (``docs/extending.md`` once sent readers to a test file that was not there)."""
    named = r"`((?:diffsweep|tests|kernels|analysis|slurm|sweeps)/[\w./-]+\.(?:py|yaml|sh|md))"
    to_create = {"diffsweep/model/attention/diff_v3.py", "diffsweep/launch/jobs/pbs_scheduler.py"}  # extending.md's examples
    bad = [f"{page.name}: {path}" for page in PAGES for path in re.findall(named, page.read_text())
           if "*" not in path and path not in to_create and not (ROOT / path).exists()]
    assert not bad, bad


def test_markdown_tables_are_not_broken_by_a_blank_line():
    """A blank line inside a table ends it: the rows after it render as a paragraph of pipes."""
    bad = []
    for page in PAGES:
        lines = re.sub(r"```.*?```", lambda m: "\n" * m.group().count("\n"), page.read_text(), flags=re.DOTALL)
        rows = lines.split("\n")
        for i in range(1, len(rows) - 1):
            if not rows[i].strip() and rows[i - 1].startswith("|") and rows[i + 1].startswith("| "):
                bad.append(f"{page.name}:{i + 1}")
    assert not bad, bad


def test_no_file_points_outside_the_repository_to_shared_notes():
    """The notes outside the repository are not shipped: what the code relied on is in docs/references.md."""
    outside = "../" + "shared/"
    hits = [f"{path.relative_to(ROOT)}:{n}"
            for folder in ("diffsweep", "tests", "analysis", "docs", "sweeps", "kernels", "slurm")
            for path in sorted((ROOT / folder).rglob("*")) if path.is_file() and path.suffix in (".py", ".md", ".yaml", ".sh")
            for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1) if outside in line]
    hits += [f"README.md:{n}" for n, line in enumerate(README.read_text().splitlines(), 1) if outside in line]
    assert not hits, hits


def test_readme_where_example_names_a_value_its_key_can_have():
    """`--where KEY=VALUE` on a config key must be a value that key can take, or it never matches (the
    README once had `model.attention.head_norm=true`; head_norm is rmsnorm | none)."""
    from diffsweep.config import ConfigError
    from diffsweep.config.loading import load_config
    from diffsweep.scaling.table import parse_where

    wheres = [c.split("--where ")[1].split()[0] for c in readme_commands() if "--where " in c]
    assert wheres
    for key, _, value in parse_where(wheres):
        if not key.startswith("tags."):
            load_config(ROOT / "sweeps/runs/paper-1.4B-diff_v1.yaml", [f"{key}={value}"])
    with pytest.raises(ConfigError, match="head_norm"):
        load_config(ROOT / "sweeps/runs/paper-1.4B-diff_v1.yaml", ["model.attention.head_norm=true"])


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """A copy of the README's sweeps and configs: commands run there write nothing into the checkout."""
    import shutil

    root = tmp_path_factory.mktemp("readme")
    shutil.copytree(ROOT / "sweeps", root / "sweeps")
    shutil.copytree(ROOT / "slurm", root / "slurm")
    return root


@pytest.mark.parametrize("command", [c for c, check in CHECKS.items() if check[0] in ("run", "cheap")])
def test_readme_command_runs(command, project):
    check = CHECKS[command]
    r = cli(*check[1], cwd=project, env={"COLUMNS": "200", "MLFLOW_TRACKING_URI": f"sqlite:///{project / 'mlflow.db'}"})
    assert r.returncode == 0, f"{command}\n{r.stdout}\n{r.stderr}"
    assert r.stdout.strip()


def test_commands_checked_elsewhere_name_a_test_that_exists():
    for command, check in CHECKS.items():
        if check[0] == "elsewhere":
            file, _, name = check[1].partition("::")
            assert f"\ndef {name}(" in (ROOT / file).read_text(), f"{command}: no test {check[1]}"


def test_readme_module_commands_parse(tmp_path):
    import subprocess
    import sys

    for command, check in CHECKS.items():
        if check[0] == "module-help":
            args = shlex.split(command)[3:]
            r = subprocess.run([sys.executable, "-m", check[1], *args, "--help"], capture_output=True, text=True,
                               cwd=ROOT, timeout=120, check=False)
            assert r.returncode == 0, f"{command}\n{r.stderr}"
            assert "usage" in r.stdout.lower()


def test_readme_data_info_runs_on_a_prepared_dataset(text_dataset):
    assert CHECKS["diffsweep data info data/demo"][0] == "data-info"
    r = cli("data", "info", str(text_dataset), cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert "bpe" in r.stdout.lower()


# -- the fit examples, for real, on runs of the README's sweeps ---------------------------------------

E, A, ALPHA = 2.30, 406.4, 0.34


def _loss(arch: str, n: float, d: float) -> float:
    """DIFF at 62.2% of the Transformer's parameters and 63.7% of its tokens (V2 at 70%), with a
    deterministic ±0.3% wiggle per point so the fit has noise to measure."""
    rho_n = {"transformer": 1.0, "diff_v1": 0.622, "diff_v2": 0.7}[arch]
    rho_d = {"transformer": 1.0, "diff_v1": 0.637, "diff_v2": 0.7}[arch]
    wiggle = 0.003 * np.sin(np.log(n) * 3.1 + np.log(d) * 1.7 + len(arch))
    return float((E + A * (n / rho_n) ** -ALPHA + 30.0 * (d / rho_d) ** -0.15) * np.exp(wiggle))


@pytest.fixture(scope="module")
def fit_project(tmp_path_factory, store_template):
    """A project folder with the README's sweeps and an MLflow store of their runs."""
    import shutil

    root = tmp_path_factory.mktemp("readme-fit")
    shutil.copyfile(store_template, root / "mlflow.db")  # migrated once per session
    shutil.copytree(ROOT / "sweeps", root / "sweeps")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    for sweep in ("fig3a-size-scan", "fig3b-token-scan", "demo-ladder", "demo-branches"):
        log_runs(uri, root / "sweeps" / f"{sweep}.yaml", _loss)
    # the tuned demo: each kind's loss 1% higher per octave away from its own best learning rate
    best = {"transformer": 2e-3, "diff_v2": 4e-3}
    log_runs(uri, root / "sweeps" / "demo-tuned.yaml", _loss,
             lambda run: 0.01 * abs(np.log2(run.config.train.lr / best[run.config.model.attention.kind])))
    return root, {"MLFLOW_TRACKING_URI": uri}


def _fit(project, args: list[str], *extra: str) -> dict:
    root, env = project
    # fewer bootstrap draws than the default: the examples run as written; their CIs are not checked here
    r = cli("fit", *args, "--boot", "50", "--json", *extra, cwd=root, env=env)
    assert r.returncode == 0, f"fit {' '.join(args)}\n{r.stderr}"
    return json.loads(r.stdout)


@pytest.mark.slow  # five fits with MLflow logging, ~1 min (3 under load); CI runs it
@pytest.mark.xdist_group("readme_fit")  # one worker logs the runs of fit_project
def test_readme_fit_examples_run_as_written(fit_project):
    """In the README's order: the sweep fit writes fits/fig3a-size-scan-N/points.csv, which the
    --csv example then refits exactly."""
    results = {}
    for command, check in CHECKS.items():
        if check[0] == "fit":
            results[command] = _fit(fit_project, check[1])
    sweep = results["diffsweep fit sweeps/fig3a-size-scan.yaml"]
    assert sweep["axis"] == "N" and sweep["candidates"] == ["diff_v1"] and sweep["points_used"] == 10
    where = results["diffsweep fit --experiment fig3a-size-scan --where train.seed=0 --at 11B --holdout largest"]
    assert any(row["at"] == 11e9 for row in where["ratios"]) and "holdout" in where
    tokens = results["diffsweep fit sweeps/fig3b-token-scan.yaml"]
    assert tokens["axis"] == "D" and tokens["paper_reading"]["at"] == 251e9
    frozen = results["diffsweep fit --csv fits/fig3a-size-scan-N/points.csv"]
    assert frozen["ratios"] == sweep["ratios"]
    tuned = results["diffsweep fit sweeps/demo-tuned.yaml"]
    winners = {(c["arch"], c["winner"]) for c in tuned["tuning"]["cells"]}
    assert tuned["tuning"]["columns"] == ["lr"] and winners == {("transformer", "lr=0.002"), ("diff_v2", "lr=0.004")}
    branches = results["diffsweep fit sweeps/demo-branches.yaml"]
    assert branches["axis"] == "D" and branches["token_points"] == "branches" and branches["points_used"] == 16
    assert branches["resampling"]["unit"] == "run"  # a parent and its branches share one run offset
    demo = results["diffsweep fit sweeps/demo-ladder.yaml --holdout largest"]
    assert demo["candidates"] == ["diff_v1", "diff_v2"] and not demo["paper_reading"]["available"]


@pytest.mark.slow  # four more fits, one of them Chinchilla's 4,500-start grid
@pytest.mark.xdist_group("readme_fit")  # one worker logs the runs of fit_project
def test_readme_fit_option_list_runs(fit_project):
    root = fit_project[0]
    assert CHECKS["diffsweep fit ... --form chinchilla | --form pure | --shared-e | --count non_embedding | --json"]
    for options in (["--form", "pure"], ["--shared-e"], ["--count", "non_embedding"]):
        result = _fit(fit_project, ["sweeps/fig3a-size-scan.yaml", "--no-log", "--out", "opt"], *options)
        assert result["ratios"]
    # chinchilla: an N x D grid (3 sizes x 4 token budgets of the fig3a ladder)
    import pandas as pd

    rows = [{"arch": arch, "num_params": n, "tokens": d, "loss": _loss(arch, n, d)}
            for arch in ("transformer", "diff_v1") for n in (0.83e9, 1.4e9, 2.8e9, 6.8e9)
            for d in (2.5e9, 5e9, 10e9, 20e9)]
    pd.DataFrame(rows).to_csv(root / "grid.csv", index=False)
    result = _fit(fit_project, ["--csv", "grid.csv", "--no-log", "--out", "chin"], "--form", "chinchilla")
    assert result["form"] == "chinchilla" and result["ratios"]
    assert re.fullmatch(r"N,D", result["axis"])


@pytest.mark.slow  # a fit and four rankings of ~20 candidates, the fewest draws suggest takes, ~30 s
@pytest.mark.xdist_group("readme_fit")  # one worker logs the runs of fit_project
def test_readme_suggest_examples_run_as_written(fit_project):
    """On the fig3a runs (and the fit folder the README's sweep fit writes): a ranked table of the
    measured points' other seeds (and 20B/30B), and with --budget the greedy set within it."""
    root, env = fit_project
    if not (root / "fits/fig3a-size-scan-N/fit.json").exists():
        _fit(fit_project, CHECKS["diffsweep fit sweeps/fig3a-size-scan.yaml"][1])
    for command, check in CHECKS.items():
        if check[0] != "suggest":
            continue
        r = cli("suggest", *check[1], "--boot", "50", "--draws", "8", cwd=root, env=env)  # 8: the fewest it takes
        assert r.returncode == 0, f"{command}\n{r.stderr}"
        if "--json" in check[1]:
            out = json.loads(r.stdout)
            ranked = [row["reduction_per_gpu_hour"] for row in out["candidates"]]
            assert len(ranked) > 10 and ranked == sorted(ranked, reverse=True), ranked
            assert any(row["num_params"] == 20e9 for row in out["candidates"])
            assert 0 < out["budget"]["spent_gpu_hours"] <= 5000
        else:
            assert "GPU-h" in r.stdout and "another seed" in r.stdout, r.stdout
            if "--budget" in check[1]:
                assert "greedy" in r.stdout, r.stdout


# -- the compare example, for real, on the Table 6 sweep's runs --------------------------------------

TABLE6 = {"transformer-1.4B-hd_128": 3.087, "transformer-1.4B-hd_256": 3.088, "transformer-1.4B-hd_256-gn_on": 3.086,
          "diff_v1-1.4B-hd_128": 3.062, "diff_v1-1.4B-hd_128-gn_off": 3.122, "diff_v1-1.4B-hd_128-lam_0.8": 3.065,
          "diff_v1-1.4B-hd_128-lam_0.5": 3.066}  # the paper's Table 6


@pytest.mark.slow  # 21 runs logged to SQLite and one CLI process, ~20 s on 2 busy cores
def test_readme_compare_example_runs_as_written(tmp_path, store_template):
    """The paper's Table 6 losses at the end of every run, each seed off by up to 0.004 nats: removing
    GroupNorm (+0.060) is beyond seed noise, lambda_init 0.8 (+0.003) within it."""
    import shutil

    command = "diffsweep compare sweeps/table6-ablation.yaml --baseline diff_v1-1.4B-hd_128"
    assert CHECKS[command][0] == "compare"
    shutil.copytree(ROOT / "sweeps", tmp_path / "sweeps")
    shutil.copyfile(store_template, tmp_path / "mlflow.db")  # migrated once per session
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"

    def row(run) -> str:
        return re.sub(r"-s\d$", "", run.name)

    log_runs(uri, tmp_path / "sweeps" / "table6-ablation.yaml", lambda arch, n, d: 0.0,
              offset=lambda run: TABLE6[row(run)] + 0.004 * np.sin(2.1 * run.config.train.seed + len(run.name)))
    r = cli(*shlex.split(command)[1:], cwd=tmp_path, env={"MLFLOW_TRACKING_URI": uri, "COLUMNS": "200"})
    assert r.returncode == 0, r.stderr
    lines: dict[str, str] = {}  # the table's row of each label (its sentence starts with the label too)
    for line in r.stdout.splitlines():
        if line.split() and line.split()[0] in TABLE6:
            lines.setdefault(line.split()[0], line)
    assert set(lines) == set(TABLE6) and "(baseline)" in lines["diff_v1-1.4B-hd_128"]
    assert lines["diff_v1-1.4B-hd_128-gn_off"].endswith("beyond seed noise")
    assert lines["diff_v1-1.4B-hd_128-lam_0.8"].endswith("within seed noise")
    assert "pooled seed sd" in r.stdout and "on 14 df" in r.stdout
