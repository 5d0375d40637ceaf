"""A real mini ladder for the fit's end-to-end tests: 4 sizes x 2 architectures trained for a
few steps with the local executor, logged to a session SQLite MLflow store."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.helpers.cli import run
from tests.launch.conftest import TINY_SET

# Mark every test that uses ``mini_ladder`` with this: one worker builds the ladder, not each.
MINI_LADDER = pytest.mark.xdist_group("mini_ladder")

SIZES = ("tiny-3xs", "tiny-2xs", "tiny-xs", "tiny-s")  # the four smallest: the fit, not the models, is tested


def tiny_ladder_sweep(root: Path, name: str, sizes: tuple[str, ...], dataset: Path, **settings) -> Path:
    """``root/<name>.yaml``: tiny models on ``dataset`` at ``sizes`` x (transformer, diff_v1), run
    locally two at a time; ``settings``: train.* keys (dots as in the YAML) over TINY_SET's."""
    merged = {**TINY_SET, "data.path": str(dataset), **settings}
    del merged["model.size"]
    lines = [f"name: {name}", "set:"] + [f"  {k}: {v}" for k, v in merged.items()]
    lines += ["grid:", f"  model.size: [{', '.join(sizes)}]", "  model.attention.kind: [transformer, diff_v1]",
              "launch:", "  profile: local", "  max_parallel: 2"]
    sweep = root / f"{name}.yaml"
    sweep.write_text("\n".join(lines) + "\n")
    return sweep


@pytest.fixture(scope="session")
def mini_ladder(tmp_path_factory, text_dataset, store_template) -> dict:
    """{'dir': project dir, 'sweep': sweep file, 'env': MLFLOW_TRACKING_URI, 'uri': ...}. Built once per
    test process (~95 s on 2 busy cores): every test that uses it is marked
    ``xdist_group("mini_ladder")`` (``MINI_LADDER``), so ``-n N --dist loadgroup`` builds it once."""
    root = tmp_path_factory.mktemp("ladder")
    sweep = tiny_ladder_sweep(root, "mini-ladder", SIZES, text_dataset,
                              **{"train.max_steps": 12, "train.eval_every": 6, "train.checkpoint_every": 6})
    shutil.copyfile(store_template, root / "mlflow.db")  # migrated once per session
    uri = f"sqlite:///{root / 'mlflow.db'}"
    env = {"MLFLOW_TRACKING_URI": uri}
    r = run("launch", str(sweep), "--executor", "local", "--wait", cwd=root, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    return {"dir": root, "sweep": sweep, "env": env, "uri": uri}


def outputs(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
