"""``diffsweep fit`` repeats the matched-arm audit on the runs it uses and reports it."""

from __future__ import annotations

import json

import numpy as np
import pytest

from diffsweep.config.units import human
from tests.helpers.cli import run
from tests.scaling.synthetic import ladder


def test_fit_report_has_the_arm_audit_of_the_runs_it_used(tmp_path, store):
    points = ladder(noise_sd=0.003, seeds=2, rng=np.random.default_rng(1))
    points["size"] = [human(n) for n in points["num_params"]]  # 830M, 1.4B, ...
    points["schedule"], points["warmup_steps"], points["lr"], points["batch_tokens"] = "linear", 375, 3e-4, 2 ** 19
    odd = (points["arch"] == "diff_v1") & (points["size"] == "1.4B")
    points.loc[odd, "warmup_steps"] = 500  # one DIFF arm warmed up longer than its Transformer twin
    points.loc[odd, "lr"] = 6e-4  # at twice the lr
    points.loc[(points["arch"] == "diff_v1") & (points["size"] == "2.8B"), "batch_tokens"] = 2 ** 20  # another: 2x batch
    points.loc[odd & (points["seed"] == 1), "num_params"] *= 1.05  # and one of its runs is larger
    path = tmp_path / "p.csv"
    points.to_csv(path, index=False)
    r = run("fit", "--csv", str(path), "--no-log", "--boot", "50", "--json", "--out", "f", cwd=tmp_path, env=store)
    assert r.returncode == 0, r.stderr
    audit = json.loads(r.stdout)["audit"]
    assert audit["baseline"] == "transformer" and len(audit["pairs"]) == 5 and audit["flagged"] == 4
    (pair,) = [p for p in audit["pairs"] if p["group"] == "1.4B"]
    flagged = {d["field"]: d for d in pair["differences"] if d["flagged"]}
    assert set(flagged) == {"warmup_steps", "params", "lr"}
    assert flagged["warmup_steps"]["suggestion"] == "train.warmup_steps=375"
    assert flagged["lr"]["suggestion"] == "train.lr=0.0003"
    (pair,) = [p for p in audit["pairs"] if p["group"] == "2.8B"]
    assert [d["field"] for d in pair["differences"] if d["flagged"]] == ["batch_tokens"]
    assert flagged["params"]["relative"] == pytest.approx(0.05, rel=1e-6)
    report = (tmp_path / "f" / "report.md").read_text()
    section = report.split("## Arm audit", 1)[1].split("\n## ", 1)[0]
    assert "Arm audit (vs transformer" in section
    assert "- MISMATCH 1.4B diff_v1: params +5.00%" in section and "warmup steps 500 vs 375" in section
    assert "- ok 830M diff_v1" in section
    assert "arm audit: 4 difference(s)" in report  # and a warning says so


def test_fit_without_size_labels_says_it_is_not_audited(tmp_path, store):
    path = tmp_path / "p.csv"
    ladder(noise_sd=0.003, seeds=2, rng=np.random.default_rng(1)).to_csv(path, index=False)
    r = run("fit", "--csv", str(path), "--no-log", "--boot", "50", "--out", "f", cwd=tmp_path, env=store)
    assert r.returncode == 0, r.stderr
    assert "Not audited: the points have no size labels" in (tmp_path / "f" / "report.md").read_text()

