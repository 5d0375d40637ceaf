"""The matched-arm audit: arms of one size compared across kinds, in the library and through
``diffsweep plan`` / ``launch --strict``."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from diffsweep.sweep import expand, load_sweep
from diffsweep.sweep.audit import ArmRecord, audit_records, audit_runs
from tests.helpers.cli import run as cli
from tests.launch.conftest import write_sweep

REPO = Path(__file__).resolve().parents[2]
# The shipped sweeps that compare kinds at matched parameters (the demo ladder is a CPU demo
# without param_parity: its DIFF V2 runs are flagged, which the audit is there to say).
PARITY_SWEEPS = ("diff-v2-blog", "diff-versions", "fig3a-size-scan", "fig3b-token-scan", "lambda-init",
                 "table6-ablation")


def sweep(tmp_path: Path, text: str, name: str = "s.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def audit_of(tmp_path: Path, text: str, **kw):
    return audit_runs(expand(load_sweep(sweep(tmp_path, text))).runs, **kw)


def fields(pair) -> dict:
    return {d.field: d for d in pair.differences}


def test_param_parity_passes_clean_and_attention_score_flops_are_noted_not_flagged(tmp_path):
    audit = audit_of(tmp_path, """
        grid:
          model.size: [tiny-xs, tiny-s]
          model.attention.kind: [transformer, diff_v1, diff_v2]
        derive:
          model.ffn_hidden: {rule: param_parity}
        seeds: [0, 1]
    """)
    assert [(p.group, p.candidate) for p in audit.pairs] == [("tiny-xs", "diff_v1"), ("tiny-xs", "diff_v2"),
                                                              ("tiny-s", "diff_v1"), ("tiny-s", "diff_v2")]
    assert audit.flagged == []
    flops = fields(audit.pairs[0])["flops_per_token"]
    assert flops.relative > 0.05 and not flops.flagged and "attention scores" in flops.note  # DIFF V1's two maps
    assert fields(audit.pairs[0])["seeds"].baseline == [0, 1] and not fields(audit.pairs[0])["seeds"].flagged


def test_diff_v2_without_param_parity_is_flagged_with_the_ffn_size_the_rule_derives(tmp_path):
    text = """
        grid:
          model.size: [1.4B]
          model.attention.kind: [transformer, diff_v2]
    """
    audit = audit_of(tmp_path, text)
    (pair,) = audit.pairs
    params = fields(pair)["params"]
    assert params.flagged and 0.06 < params.relative < 0.09  # the 2h query heads and λ projection
    parity = expand(load_sweep(sweep(tmp_path, textwrap.dedent(text) + "derive: {model.ffn_hidden: {rule: param_parity}}\n",
                                     "p.yaml"))).runs[1].config.model.ffn_hidden
    assert params.suggestion.startswith(f"model.ffn_hidden={parity} ")
    assert "param_parity" in params.suggestion
    assert fields(pair)["flops_per_token"].flagged  # beyond its attention scores too
    assert not fields(pair)["tokens"].flagged and not fields(pair)["lr"].flagged
    assert any(line.startswith("  MISMATCH 1.4B diff_v2: params +") for line in audit.lines())


def test_a_budget_or_schedule_of_one_kind_is_flagged_with_the_baseline_value(tmp_path):
    audit = audit_of(tmp_path, """
        set: {model.size: tiny-xs, train.batch_tokens: 4096, train.max_steps: 100}
        runs:
          - {model.attention.kind: transformer}
          - {model.attention.kind: diff_v1, train.max_steps: 80, train.lr: 3.0e-4}
    """)
    (pair,) = audit.pairs
    flagged = {d.field: d for d in pair.flagged}
    assert set(flagged) == {"tokens", "max_steps", "lr"}  # params match: diff_v1 is parameter-matched by design
    assert flagged["max_steps"].suggestion == "train.max_steps=100"
    assert flagged["tokens"].suggestion == "train.max_steps=100"  # the baseline's tokens at this batch
    assert flagged["lr"].suggestion == "train.lr=0.003"  # tiny-xs's own lr
    (line,) = [x for x in audit.lines() if "MISMATCH" in x]
    assert line.endswith("-> set train.max_steps=100, train.lr=0.003")


def test_seeds_batch_and_threshold(tmp_path):
    text = """
        set: {model.size: tiny-3xs}
        runs:
          - {model.attention.kind: transformer, train.seed: 0}
          - {model.attention.kind: transformer, train.seed: 1}
          - {model.attention.kind: diff_v1, train.seed: 0, train.batch_tokens: 131072}
    """
    audit = audit_of(tmp_path, text)
    flagged = {d.field: d for _, d in audit.flagged}
    assert flagged["seeds"].baseline == [0, 1] and flagged["seeds"].candidate == [0]
    assert flagged["batch_tokens"].suggestion == "train.batch_tokens=4096"
    # tiny-3xs: DIFF V1's λ vectors are 1.6% of its few non-embedding parameters
    assert "non_embedding_params" in flagged
    assert "non_embedding_params" not in {d.field for _, d in audit_of(tmp_path, text, threshold=0.02).flagged}


def test_arms_are_grouped_by_size_and_shared_axes_not_by_kind_switches(tmp_path):
    audit = audit_runs(expand(load_sweep(REPO / "sweeps/table6-ablation.yaml")).runs)
    (pair,) = audit.pairs  # Transformer 16x128 against every DIFF 8x128 row (head norm, λ_init are DIFF's)
    assert pair.group == "1.4B, head_dim=128" and len(pair.candidate_runs) == 4 * 3
    assert audit.unpaired == ["1.4B, head_dim=256: transformer only"]  # the 8x256 rows have no DIFF twin


@pytest.mark.parametrize("name", PARITY_SWEEPS)
def test_shipped_parity_sweeps_pass_clean(name):
    audit = audit_runs(expand(load_sweep(REPO / f"sweeps/{name}.yaml")).runs)
    assert audit.pairs and audit.flagged == [], "\n".join(audit.lines())


def test_records_without_a_config_or_a_breakdown():
    """What ``fit`` audits from its table: unknown fields are skipped, FLOPs in total shown, not flagged."""
    def rec(kind, seed, params, flops, schedule="linear"):
        return ArmRecord(name=f"{kind}-{seed}", kind=kind, group="1.4B",
                         values={"params": params, "flops_per_token": flops, "seeds": seed, "schedule": schedule,
                                 "lr": None})
    audit = audit_records([rec("transformer", 0, 100, 600), rec("diff_v1", 0, 100, 640, "cosine")])
    (pair,) = audit.pairs
    f = fields(pair)
    assert "lr" not in f and not f["flops_per_token"].flagged and "without a breakdown" in f["flops_per_token"].note
    assert f["schedule"].flagged and f["schedule"].suggestion == "train.schedule=linear"
    audit = audit_records([rec("transformer", 0, 100, 600), rec("diff_v1", 0, 110, 640)])
    f = fields(audit.pairs[0])
    assert f["params"].flagged and f["params"].suggestion is None  # no config: no FFN size to offer


# -- through the CLI --------------------------------------------------------------------------------

MISMATCHED = """\
name: mism
set: {model.size: tiny-xs, data.path: nodata, train.max_steps: 40}
grid:
  model.attention.kind: [transformer, diff_v2]
"""


def test_plan_shows_the_audit_in_text_and_json(tmp_path):
    path = sweep(tmp_path, MISMATCHED)
    r = cli("plan", str(path), "--executor", "local", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "arm audit (vs transformer" in r.stdout
    assert "MISMATCH tiny-xs diff_v2: params +" in r.stdout and "-> set model.ffn_hidden=" in r.stdout
    r = cli("plan", str(path), "--executor", "local", "--json", "--audit-threshold", "0.5", cwd=tmp_path)
    data = json.loads(r.stdout)
    assert data["audit"]["threshold"] == 0.5 and data["audit"]["flagged"] == 0  # a few % < 50%
    assert data["audit"]["pairs"][0]["candidate"] == "diff_v2"


def test_launch_strict_refuses_a_mismatch_and_submits_nothing(tmp_path):
    path = sweep(tmp_path, MISMATCHED)
    r = cli("launch", str(path), "--executor", "local", "--strict", cwd=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    error = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and error[0].startswith("error: --strict: the arm audit found differences in 1 pair")
    assert "(set model.ffn_hidden=" in error[0] and "nothing submitted" in error[0]
    assert "warning: MISMATCH tiny-xs diff_v2" in r.stderr  # the differences were listed first
    assert not (tmp_path / "runs").exists() and not (tmp_path / "mlflow.db").exists()


def test_launch_warns_without_strict_and_strict_lets_a_matched_sweep_through(tmp_path, text_dataset):
    kinds = ("transformer", "diff_v2")
    path = write_sweep(tmp_path / "w.yaml", text_dataset, kinds=kinds, name="w")
    r = cli("launch", str(path), "--executor", "local", "--dry-run", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "warning: MISMATCH tiny-xs diff_v2: params +" in r.stderr and "would submit diff_v2-tiny-xs-s0" in r.stdout
    path = write_sweep(tmp_path / "m.yaml", text_dataset, kinds=kinds, name="m",
                       extra="derive: {model.ffn_hidden: {rule: param_parity}}\n")
    r = cli("launch", str(path), "--executor", "local", "--strict", "--dry-run", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "MISMATCH" not in r.stderr and "nothing submitted" in r.stdout
