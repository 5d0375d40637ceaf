"""``diffsweep compare SWEEP --probes``: a sweep's probe evaluations as the paper's tables across arms.

The table building is checked on hand-made evaluation records against a direct computation
(means, the CI of each mean, the difference's CI and its p-value = Student's two-sample t test, or the
paired t test where arms share seeds),
its one-seed and mean-over-depths cases, the choice of evaluation step, and Monte Carlo checks of
the difference CI's coverage in the probe-table shape, unpaired and paired; then end to end, a tiny sweep of 2 kinds x
2 seeds is launched, evaluated with two probes and compared through the CLI."""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import replace

import numpy as np
import pytest
from scipy import stats

from diffsweep.compare.probe_report import markdown
from diffsweep.compare.probe_tables import MEAN, EvalRecord, ProbeComparison, build_table, choose
from diffsweep.compare.runs import BEYOND, UNKNOWN, WITHIN
from diffsweep.eval.probe import TableComparison
from tests.helpers.cli import run as cli
from tests.launch.conftest import write_sweep

OUTLIERS = TableComparison(table="outliers", title="Table 5", keys=("what",), values=("top1", "median"),
                           where=(("layer", "all"),))
NEEDLE = TableComparison(table="needle", title="Table 2", keys=("context", "depth"), values=("accuracy",),
                         mean_over="depth")


def _record(name: str, rows: list[dict], step: int = 4, end: int = 0, probe: str = "outliers",
            key: str | None = None, table: str | None = None, seed: int | None = None) -> EvalRecord:
    return EvalRecord(run_id=f"id-{name}-{step}-{end}", probe=probe, step=step, run_key=key or name, run_name=name,
                      settings='{"tokens": 64}', end_time=end, tables={table or probe: rows}, seed=seed)


def _outlier_rows(attn_top1: float, attn_median: float, hidden_top1: float, hidden_median: float) -> list[dict]:
    return [{"layer": "all", "what": "attn_logit", "top1": attn_top1, "median": attn_median},
            {"layer": 1, "what": "attn_logit", "top1": 1e6, "median": 1e6},  # a layer row: not in Table 5
            {"layer": "all", "what": "hidden", "top1": hidden_top1, "median": hidden_median}]


A = {"a-s0": (30.0, 1.0, 300.0, 0.5), "a-s1": (34.0, 1.2, 280.0, 0.7), "a-s2": (29.0, 0.9, 320.0, 0.6)}
B = {"b-s0": (10.0, 0.8, 90.0, 0.4), "b-s1": (12.0, 0.7, 110.0, 0.45)}


def _records() -> list[tuple[str, EvalRecord]]:
    return ([("a", _record(n, _outlier_rows(*v))) for n, v in A.items()]
            + [("b", _record(n, _outlier_rows(*v))) for n, v in B.items()])


def test_means_cis_and_differences_equal_a_direct_computation():
    table = build_table("outliers", OUTLIERS, _records(), ["a", "b"], "a", level=0.95)
    assert [(c.key, c.value) for c in table.cells] == [(("attn_logit",), "top1"), (("attn_logit",), "median"),
                                                        (("hidden",), "top1"), (("hidden",), "median")]
    for column, cell in enumerate(table.cells):
        a = np.array([v[column] for v in A.values()])
        b = np.array([v[column] for v in B.values()])
        pooled = math.sqrt((((a - a.mean()) ** 2).sum() + ((b - b.mean()) ** 2).sum()) / 3)  # df = 2 + 1
        t = stats.t.ppf(0.975, 3)
        arms = {s.arm: s for s in cell.arms}
        assert arms["a"].n == 3 and arms["b"].n == 2 and arms["a"].runs == tuple(A)
        assert arms["a"].mean == pytest.approx(a.mean()) and arms["b"].mean == pytest.approx(b.mean())
        assert arms["a"].half == pytest.approx(t * pooled / math.sqrt(3))
        assert arms["b"].half == pytest.approx(t * pooled / math.sqrt(2))
        (d,) = cell.differences
        half = t * pooled * math.sqrt(1 / 3 + 1 / 2)
        assert d.arm == "b" and d.delta == pytest.approx(b.mean() - a.mean())
        assert (d.lo, d.hi) == (pytest.approx(d.delta - half), pytest.approx(d.delta + half))
        assert d.p == pytest.approx(stats.ttest_ind(b, a, equal_var=True).pvalue)  # the same pooled t test
        assert d.verdict == (WITHIN if d.lo <= 0 <= d.hi else BEYOND)
        assert cell.df == 3 and cell.pooled_sd == pytest.approx(pooled)
    assert table.cells[0].differences[0].verdict == BEYOND  # 31 vs 11: far beyond the seed spread
    assert table.steps == dict.fromkeys([*A, *B], 4)


def test_one_seed_per_arm_gives_values_without_ci_and_the_markdown_says_so():
    records = [("a", _record("a-s0", _outlier_rows(*A["a-s0"]))), ("b", _record("b-s0", _outlier_rows(*B["b-s0"])))]
    table = build_table("outliers", OUTLIERS, records, ["a", "b"], "a")
    cell = table.cells[0]
    assert [(s.mean, s.half) for s in cell.arms] == [(30.0, None), (10.0, None)]
    (d,) = cell.differences
    assert (d.delta, d.lo, d.hi, d.p, d.verdict) == (-20.0, None, None, None, UNKNOWN)
    result = ProbeComparison(sweep="t", experiment="t", baseline="a", level=0.95, step=None, arms=("a", "b"),
                             tables=[table], notes=[])
    text = markdown(result, ["outliers.png"])
    assert "| attn_logit | top1 | 30 (n=1) | 10 (n=1) | -20 (no CI: one seed per arm) |" in text
    assert "±" not in text.split("## outliers")[1]


def test_mean_over_depths_averages_each_run_first():
    def rows(acc: list[float]) -> list[dict]:
        return [{"context": 100, "depth": d, "accuracy": a} for d, a in zip((0.0, 50.0, 100.0), acc, strict=True)]

    records = [("t", _record("t-s0", rows([1.0, 0.5, 0.0]), probe="needle")),
               ("t", _record("t-s1", rows([1.0, 1.0, 0.5]), probe="needle")),
               ("d", _record("d-s0", rows([1.0, 1.0, 1.0]), probe="needle")),
               ("d", _record("d-s1", rows([1.0, 1.0, 0.5]), probe="needle"))]
    table = build_table("needle", NEEDLE, records, ["t", "d"], "t")
    assert [c.key for c in table.cells] == [(100, 0.0), (100, 50.0), (100, 100.0), (100, MEAN)]
    mean = {s.arm: s for s in table.cells[-1].arms}
    assert mean["t"].values == pytest.approx((0.5, 2.5 / 3)) and mean["d"].values == pytest.approx((1.0, 2.5 / 3))
    assert table.cells[-1].differences[0].delta == pytest.approx(statistics.mean([1.0, 2.5 / 3]) - statistics.mean(
        [0.5, 2.5 / 3]))


def test_the_newest_step_of_each_run_is_chosen_or_the_step_asked_for():
    old, new = _record("a-s0", [], step=2, end=5), _record("a-s0", [], step=4, end=1)
    again = _record("a-s0", [], step=4, end=9)  # the same step evaluated again (--force): the later one
    other = _record("b-s0", [], step=2, end=3)
    assert sorted(r.run_id for r in choose([old, new, again, other])) == sorted([again.run_id, other.run_id])
    assert sorted(r.run_id for r in choose([old, new, again, other], step=2)) == sorted([old.run_id, other.run_id])
    assert choose([old, other], step=6) == []


def _probe_rows(probe: str, shift: float) -> list[dict]:
    """Rows shaped as each built-in probe's table (see its ``Probe`` class docstring)."""
    if probe == "outliers":
        return _outlier_rows(30 + shift, 1.0, 300.0, 0.5 + shift)
    if probe == "quantization_downstream":
        return [{"bits": b, "granularity": "head", "task": t, "metric": m, "value": 0.4 + shift + 1 / b,
                 "stderr": 0.02, "samples": 100,
                 "delta": 1 / b - 1 / 16} for b in (16, 8, 4) for t in ("arc_easy", "piqa") for m in ("acc", "acc_norm")]
    if probe == "quantization":
        return [{"bits": b, "granularity": "head", "val_loss": 3.0 + shift + 1 / b, "delta": 1 / b - 1 / 16}
                for b in (16, 8, 4)]
    if probe == "needle":
        return [{"needles": 6, "queries": 2, "context": c, "depth": d, "samples": 5, "accuracy": min(1.0, 0.5 + shift)}
                for c in (64, 128) for d in (0.0, 50.0, 100.0)]
    if probe == "attention_focus":
        return [{"depth": d, "context": 128, "needles": 4, "samples": 5, "layers": 2, "answer": 0.3 + shift,
                 "noise": 0.5 - shift} for d in (0.0, 100.0)]
    if probe == "downstream":
        return [{"task": t, "metric": m, "value": 0.4 + shift + (0.1 if m == "acc_norm" else 0), "stderr": 0.02,
                 "samples": 100} for t in ("arc_easy", "piqa") for m in ("acc", "acc_norm")]
    if probe == "icl_curve":
        return [{"shots": k, "accuracy": min(1.0, 0.3 + 0.1 * k + shift)} for k in (1, 2, 4)]
    if probe == "icl_robust":
        return [{"shots": 4, "mean": 0.5 + shift, "std": 0.05, "best": 0.6 + shift, "worst": 0.4 + shift,
                 "margin": 0.2, "grouped": 0.45, "alternate": 0.5}]
    return [{"position": t, "nll": 5.0 - shift, "cumulative": 5.5 - shift} for t in (1, 2, 4, 8, 16)]


@pytest.mark.parametrize("probe, index", [("outliers", 0), ("quantization", 0), ("quantization", 1), ("needle", 0),
                                          ("attention_focus", 0),
                                          ("nll_position", 0), ("downstream", 0), ("icl", 0), ("icl", 1)])
def test_every_probe_table_is_built_written_and_plotted(probe, index, tmp_path):
    from diffsweep.compare.probe_report import plot
    from diffsweep.eval.probe import get_probe

    spec = get_probe(probe).comparisons[index]
    shape = spec.table if probe == "icl" or index else probe
    records = [(arm, _record(f"{arm}-s{s}", _probe_rows(shape, shift + 0.01 * s), probe=probe, table=spec.table))
               for arm, shift in (("transformer", 0.0), ("diff", 0.2)) for s in range(2)]
    table = build_table(probe, spec, records, ["transformer", "diff"], "transformer")
    assert table.cells and all(len(c.arms) == 2 and len(c.differences) == 1 for c in table.cells)
    if spec.mean_over:
        assert any(MEAN in c.key for c in table.cells)
    result = ProbeComparison(sweep="t", experiment="t", baseline="transformer", level=0.95, step=None,
                             arms=("transformer", "diff"), tables=[table], notes=[])
    text = markdown(result, [f"{probe}.png"])
    assert f"## {probe}: {spec.title}" in text and "| diff − transformer (95% CI) |" in text
    assert plot([table], result, tmp_path / f"{probe}.png").stat().st_size > 1000


def test_difference_ci_covers_the_true_difference_at_the_nominal_rate():
    """400 sweeps of 2 arms x 3 seeds, each run's table two cells x two values with normal seed
    noise (sd 1) around known means; the 95% CI of each difference should hold the true one 95%
    of the time: 1600 CIs (independent cells), binomial sd 0.54%, so a band of ±2% is ~3.7 sd. The
    CIs of the arms' means likewise (3200, correlated within a sweep through the pooled sd)."""
    rng = np.random.default_rng(20261124)
    truth = {"a": (30.0, 1.0, 300.0, 0.5), "b": (10.0, 1.0, 301.5, -0.5)}
    covered, total, mean_covered = 0, 0, 0
    for _ in range(400):
        records = [(arm, _record(f"{arm}-s{s}", _outlier_rows(*(m + rng.normal() for m in means))))
                   for arm, means in truth.items() for s in range(3)]
        table = build_table("outliers", OUTLIERS, records, ["a", "b"], "a")
        for column, cell in enumerate(table.cells):
            (d,) = cell.differences
            true = truth["b"][column] - truth["a"][column]
            covered += d.lo <= true <= d.hi
            total += 1
            mean_covered += sum(abs(s.mean - truth[s.arm][column]) <= s.half for s in cell.arms)
    assert total == 1600
    assert 0.93 <= covered / total <= 0.97, covered / total  # measured: 0.951
    assert 0.93 <= mean_covered / (2 * total) <= 0.97, mean_covered / (2 * total)  # each arm's mean ± CI: 0.948


def test_arms_sharing_seeds_are_compared_by_a_paired_t_test():
    """Seeds 0-2 in both arms (and a seed 3 only the baseline has): the difference is the paired t
    over the shared seeds, computed here directly (and equal to scipy's paired t test); arms
    sharing fewer than two seeds fall back to the unpaired pooled t."""
    a = {0: 30.0, 1: 34.0, 2: 29.0, 3: 40.0}
    b = {0: 10.5, 1: 13.0, 2: 9.0}
    records = ([("a", _record(f"a-s{s}", _outlier_rows(v, 1, 1, 1), seed=s)) for s, v in a.items()]
               + [("b", _record(f"b-s{s}", _outlier_rows(v, 1, 1, 1), seed=s)) for s, v in b.items()])
    cell = build_table("outliers", OUTLIERS, records, ["a", "b"], "a").cells[0]
    (d,) = cell.differences
    diffs = np.array([b[s] - a[s] for s in (0, 1, 2)])
    half = stats.t.ppf(0.975, 2) * diffs.std(ddof=1) / math.sqrt(3)
    assert d.pairs == 3 and d.delta == pytest.approx(diffs.mean())
    assert (d.lo, d.hi) == (pytest.approx(diffs.mean() - half), pytest.approx(diffs.mean() + half))
    assert d.p == pytest.approx(stats.ttest_rel([b[s] for s in (0, 1, 2)], [a[s] for s in (0, 1, 2)]).pvalue)
    assert d.verdict == BEYOND
    assert [s.mean for s in cell.arms] == [pytest.approx(statistics.mean(a.values())),
                                           pytest.approx(statistics.mean(b.values()))]
    # one shared seed: unpaired
    records = ([("a", _record(f"a-s{s}", _outlier_rows(a[s], 1, 1, 1), seed=s)) for s in (0, 1)]
               + [("b", _record(f"b-s{s}", _outlier_rows(b[s], 1, 1, 1), seed=s)) for s in (1, 2)])
    (d,) = build_table("outliers", OUTLIERS, records, ["a", "b"], "a").cells[0].differences
    assert d.pairs == 0 and d.delta == pytest.approx((b[1] + b[2]) / 2 - (a[0] + a[1]) / 2)
    text = markdown(ProbeComparison(sweep="t", experiment="t", baseline="a", level=0.95, step=None, arms=("a", "b"),
                                    tables=[build_table("outliers", OUTLIERS, [*records, ("b", _record(
                                        "b-s0", _outlier_rows(b[0], 1, 1, 1), seed=0))], ["a", "b"], "a")],
                                    notes=[]), ["o.png"])
    assert "paired on 2 seeds" in text and "a paired t test over the seeds both arms have" in text


def test_paired_difference_ci_covers_the_true_difference_at_the_nominal_rate():
    """400 sweeps of 2 arms x 4 seeds where a seed moves both arms alike (sd 3: data order and
    init luck) on top of each run's own noise (sd 0.5): the paired 95% CI holds the true
    difference 95% of the time (1600 CIs, binomial sd 0.54%, band ±2%), and is much narrower
    than the unpaired CI of the same runs, which the shared seed effect inflates."""
    rng = np.random.default_rng(20261125)
    truth = {"a": (30.0, 1.0, 300.0, 0.5), "b": (29.0, 1.0, 301.5, -0.5)}
    covered = total = 0
    width_paired = width_unpaired = 0.0
    for _ in range(400):
        luck = rng.normal(0, 3, size=(4, 4))  # seed x value column
        records = [(arm, _record(f"{arm}-s{s}", _outlier_rows(*(m + luck[s, i] + rng.normal(0, 0.5)
                                                                 for i, m in enumerate(means))), seed=s))
                   for arm, means in truth.items() for s in range(4)]
        paired = build_table("outliers", OUTLIERS, records, ["a", "b"], "a")
        unpaired = build_table("outliers", OUTLIERS, [(arm, replace(r, seed=None)) for arm, r in records],
                               ["a", "b"], "a")
        for column, (cell, other) in enumerate(zip(paired.cells, unpaired.cells, strict=True)):
            (d,), (u,) = cell.differences, other.differences
            assert d.pairs == 4 and u.pairs == 0
            covered += d.lo <= truth["b"][column] - truth["a"][column] <= d.hi
            total += 1
            width_paired += d.hi - d.lo
            width_unpaired += u.hi - u.lo
    assert total == 1600
    assert 0.93 <= covered / total <= 0.97, covered / total  # measured: 0.949 (paired widths 0.21x unpaired)
    assert width_paired < width_unpaired / 3, (width_paired, width_unpaired)


# -- end to end: launch, eval, compare --probes ---------------------------------------------------------


@pytest.mark.slow
def test_a_sweep_of_two_kinds_by_two_seeds_is_compared_probe_by_probe(tmp_path, text_dataset, store):
    from mlflow.tracking import MlflowClient

    sweep = write_sweep(tmp_path / "t.yaml", text_dataset, steps=4, extra="seeds: 2\n")
    r = cli("launch", str(sweep), "--executor", "local", "--max-parallel", "2", "--wait", cwd=tmp_path, env=store)
    assert r.returncode == 0, r.stdout + r.stderr
    r = cli("compare", str(sweep), "--probes", cwd=tmp_path, env=store)  # nothing evaluated yet
    assert r.returncode == 2 and "diffsweep eval" in r.stderr and "--probe" in r.stderr, r.stderr
    assert len([line for line in r.stderr.splitlines() if line.strip()]) == 1, r.stderr
    r = cli("eval", str(sweep), "--probe", "outliers", "--probe", "quantization", "--probe-set", "outliers.tokens=64",
            "--probe-set", "quantization.tokens=64", "--probe-set", "quantization.bits=[16, 8, 4]", cwd=tmp_path,
            env=store)
    assert r.returncode == 0, r.stdout + r.stderr

    r = cli("compare", str(sweep), "--probes", "--json", cwd=tmp_path, env=store)
    assert r.returncode == 0, r.stdout + r.stderr
    data = json.loads(r.stdout)
    out = tmp_path / "compare" / "t-probes"
    assert (tmp_path / data["folder"]).resolve() == out.resolve() and data["baseline"] == "transformer-tiny-xs"
    assert data["arms"] == ["transformer-tiny-xs", "diff_v1-tiny-xs"]
    text = (out / "probes.md").read_text()
    for heading in ("## outliers: Table 5", "## quantization: Fig. 8"):
        assert heading in text
    for key in ("what", "bits"):  # both arms as columns of both tables, and the difference
        assert (f"| {key} | value | transformer-tiny-xs | diff_v1-tiny-xs | diff_v1-tiny-xs − transformer-tiny-xs "
                "(95% CI) |") in text
    assert "| attn_logit | top1 |" in text and "| 4 | val_loss |" in text
    assert "diff_v1-tiny-xs − transformer-tiny-xs (95% CI)" in text and "(n=2)" in text
    assert "paired on 2 seeds" in text  # both arms ran seeds 0 and 1
    assert {p.name for p in out.glob("*.png")} == {"outliers.png", "quantization.png"}
    assert all(p.stat().st_size > 1000 for p in out.glob("*.png"))
    saved = json.loads((out / "probes.json").read_text())
    assert [t["probe"] for t in saved["tables"]] == ["outliers", "quantization"]

    # the numbers are the evaluation runs' own metrics, averaged over seeds
    client = MlflowClient(store["MLFLOW_TRACKING_URI"])
    exp = client.get_experiment_by_name("t")
    evals = client.search_runs([exp.experiment_id], "tags.`diffsweep.kind` = 'eval' and "
                               "tags.`diffsweep.eval.probe` = 'outliers'")
    top1 = {run.data.tags["diffsweep.eval.sweep_run"]: run.data.metrics["outliers/attn_logit/top1"] for run in evals}
    assert len(top1) == 4
    cell = next(c for c in saved["tables"][0]["cells"] if c["key"] == {"what": "attn_logit"} and c["value"] == "top1")
    for arm in cell["arms"]:
        assert arm["n"] == 2 and arm["ci_half"] is not None
        assert arm["mean"] == pytest.approx(statistics.mean(top1[name] for name in arm["runs"]))
        assert sorted(arm["runs"]) == sorted(n for n in top1 if n.startswith(arm["arm"]))
    (diff,) = cell["differences"]
    pairs = [top1[f"diff_v1-tiny-xs-s{s}"] - top1[f"transformer-tiny-xs-s{s}"] for s in (0, 1)]
    assert diff["paired_seeds"] == 2 and diff["delta"] == pytest.approx(statistics.mean(pairs))
    quant = saved["tables"][1]
    assert {c["key"]["bits"] for c in quant["cells"]} == {16, 8, 4}

    run = client.get_run(data["mlflow_run_id"])
    assert run.data.tags["diffsweep.kind"] == "comparison" and run.info.status == "FINISHED"
    assert run.data.tags["diffsweep.comparison.sweep"] == "t"
    assert {a.path for a in client.list_artifacts(run.info.run_id)} >= {"probes.md", "probes.json", "outliers.png"}
    from diffsweep.scaling.table import from_mlflow

    points = from_mlflow(store["MLFLOW_TRACKING_URI"], "t")  # a fit reads the 4 training runs only
    assert len(points) == 4 and run.info.run_id not in set(points["run_id"])

    # the seed comparison of training runs is unchanged by the evaluation and comparison runs
    r = cli("compare", str(sweep), "--json", cwd=tmp_path, env=store)
    assert r.returncode == 0, r.stderr
    assert [row["n"] for row in json.loads(r.stdout)["rows"]] == [2, 2]
    r = cli("compare", str(sweep), "--probes", "--only", "diff_v1", "--out", "one", "--no-log", "--json",
            cwd=tmp_path, env=store)  # one arm of the sweep (e.g. one size of a ladder)
    assert r.returncode == 0 and json.loads(r.stdout)["arms"] == ["diff_v1-tiny-xs"], r.stdout + r.stderr
    r = cli("compare", str(sweep), "--probes", "--step", "3", cwd=tmp_path, env=store)
    assert r.returncode == 2 and "--step" in r.stderr and "[4]" in r.stderr, r.stderr
    r = cli("compare", str(sweep), "--out", "elsewhere", cwd=tmp_path, env=store)  # the seed comparison writes none
    assert r.returncode == 2 and "--out: applies only with --probes" in r.stderr, r.stderr
