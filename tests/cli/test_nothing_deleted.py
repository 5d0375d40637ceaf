"""No ``--force`` and no output option anywhere deletes or changes a file diffsweep did not write.

Every option of the CLI that names where output goes (``--out``, ``--dest``,
``--artifacts-destination``) or lets a command replace something (``--force``) is read from the CLI
itself and must have a scenario here: a user's folder (or file) at that place, the command run as a
user would, every one of the user's files byte-for-byte the same afterwards. A new output option
without a scenario fails ``test_every_output_option_has_a_scenario``. Each command's own tests
cover its other cases (an input as ``--out``, an earlier output replaced); this is the one place
that shows the rule holds for all of them.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import typer

from diffsweep.cli import app
from tests.helpers.badinput import diffsweep, refused, tree_state
from tests.helpers.tracking import mlflow_client

ROOT = typer.main.get_command(app)
OUTPUT_FLAGS = ("--out", "--force", "--dest", "--artifacts-destination")
REPO = Path(__file__).resolve().parents[2]
FIT_CSV = "arch,num_params,tokens,loss\n" + "".join(
    f"{arch},{n},{20 * n},{1.7 + 400 / n ** 0.34 + (0.0 if arch == 'transformer' else -0.01):.5f}\n"
    for arch in ("transformer", "diff_v1") for n in (10**6, 3 * 10**6, 10**7, 3 * 10**7))


def output_options() -> set[tuple[str, str]]:
    """(command, flag) of every output or replace option of the CLI, e.g. ('data prepare', '--force')."""
    found = set()

    def walk(command, path):
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, (*path, name))
        for param in command.params:
            for flag in getattr(param, "opts", []):
                if flag in OUTPUT_FLAGS:
                    found.add((" ".join(path), flag))

    walk(ROOT, ())
    return found


def users_things(root: Path) -> None:
    """What the user owns in ``root``: a folder ``mine`` of notes and data, a corpus and a sweep."""
    (root / "mine" / "sub").mkdir(parents=True)
    (root / "mine" / "notes.txt").write_text("my notes\n")
    (root / "mine" / "sub" / "data.bin").write_bytes(bytes(range(256)))
    (root / "corpus.txt").write_text("Some English text, which the user wrote and keeps.\n" * 20)
    (root / "base.yaml").write_text("model: {size: tiny-3xs}\ndata: {path: data, tokenizer: bytes}\n"
                                    "train: {max_steps: 2, warmup_steps: 1, batch_tokens: 256, seq_len: 64}\n")
    (root / "sweep.yaml").write_text("name: s\nbase: base.yaml\ngrid: {train.seed: [0, 1]}\n")
    (root / "points.csv").write_text(FIT_CSV)


# (command, flag) -> the arguments of each scenario that puts that option at the user's things.
# Each scenario is refused (exit 2, one line naming ``names``) or succeeds; either way it must
# leave every file the user had exactly as it was.
SCENARIOS: dict[tuple[str, str], list[tuple[tuple[str, ...], str | None]]] = {
    ("data prepare", "--out"): [(("data", "prepare", "corpus.txt", "--tokenizer", "bytes", "--out", "mine"), "mine")],
    ("data prepare", "--force"): [
        (("data", "prepare", "corpus.txt", "--tokenizer", "bytes", "--out", "mine", "--force"), "mine"),
        (("data", "prepare", "corpus.txt", "--tokenizer", "bytes", "--out", "corpus.txt", "--force"), "corpus.txt"),
        (("data", "prepare", "corpus.txt", "--tokenizer", "bytes", "--out", ".", "--force"), "corpus.txt"),
        (("data", "prepare", "mine", "--tokenizer", "bytes", "--out", "mine/sub", "--force"), "mine"),
        (("data", "prepare", "corpus.txt", "--tokenizer", "bytes", "--out", "mine", "--force", "--launch",
          "--executor", "local"), "mine"),
    ],
    ("eval", "--out"): [(("eval", "sweep.yaml", "--probe", "outliers", "--out", "mine"), "mine")],
    ("eval", "--force"): [(("eval", "sweep.yaml", "--probe", "outliers", "--out", "mine", "--force"), "mine")],
    ("compare", "--out"): [(("compare", "sweep.yaml", "--probes", "--out", "mine"), "mine"),
                           (("compare", "sweep.yaml", "--probes", "--out", "mine/notes.txt"), "notes.txt")],
    ("fit", "--out"): [(("fit", "--csv", "points.csv", "--out", "mine"), "mine"),
                       (("fit", "--csv", "points.csv", "--out", "."), "points.csv")],
    ("bench attention", "--out"): [(("bench", "attention", "--out", "mine/notes.txt"), "notes.txt")],
    ("bench model", "--out"): [(("bench", "model", "--out", "mine/notes.txt"), "notes.txt")],
    **{(cmd, "--out"): [((cmd, "sweep.yaml", "--out", "mine"), "mine")]
       for cmd in ("plan", "launch", "status", "cancel", "reconcile")},
    ("logs", "--out"): [(("logs", "s", "--sweep", "sweep.yaml", "--out", "mine"), "mine")],
    ("train", "--out"): [(("train", "base.yaml", "--out", "mine/notes.txt"), "notes.txt")],
    ("server", "--artifacts-destination"): [(("server", "--artifacts-destination", "mine/notes.txt"), "notes.txt")],
    # doctor writes only its own folder under --out (.doctor/<time>-<pid>) and removes it again.
    ("doctor", "--out"): [(("doctor", "--out", "mine", "--executor", "local"), None)],
    # fetch-demo downloads what is missing; with the archives there it only checks them.
    ("data fetch-demo", "--dest"): [(("data", "fetch-demo", "--dest", "mine"), None)],
}


def test_every_output_option_has_a_scenario():
    assert output_options() == set(SCENARIOS)


def users_files(root: Path) -> dict[str, str]:
    return {k: v for k, v in tree_state(root).items() if k in {"mine", "corpus.txt", "base.yaml", "sweep.yaml",
                                                                "points.csv"} or k.startswith("mine/")}


CASES = [(key, args, names) for key, scenarios in SCENARIOS.items() for args, names in scenarios]


@pytest.mark.parametrize(("key", "args", "names"), CASES, ids=[" ".join(args) for _, args, _ in CASES])
def test_no_output_option_deletes_or_changes_what_the_user_owns(key, args, names, tmp_path, request):
    users_things(tmp_path)
    if key == ("data fetch-demo", "--dest"):
        sources = REPO / "data" / "sources"
        archives = sorted(sources.glob("*.tar.gz")) + sorted(sources.glob("*.deb"))
        if len(archives) < 2:
            pytest.skip("the demo archives are not in data/sources (run `diffsweep data fetch-demo`); "
                        "fetching them here would use the network")
        for archive in archives:
            shutil.copy(archive, tmp_path / "mine" / archive.name)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    if key == ("compare", "--out"):  # compare reads the sweep's store first: one with the sweep's experiment
        uri = request.getfixturevalue("store")["MLFLOW_TRACKING_URI"]  # the same path, a migrated copy
        mlflow_client(uri).create_experiment("s")
    before = users_files(tmp_path)
    r = diffsweep(*args, cwd=tmp_path, env={"MLFLOW_TRACKING_URI": uri})
    if names is None:
        assert r.returncode == 0, r.stderr
    else:
        line = refused(r)
        assert names in line, line
    after = users_files(tmp_path)
    assert {k: after.get(k) for k in before} == before, "the user's files changed"
