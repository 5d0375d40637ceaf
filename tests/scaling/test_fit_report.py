"""What ``diffsweep fit`` tells its reader (issue #16, items 2, 4 and 5): extrapolation on both sides,
the paper's reading beside the headline, the first paragraph, the takeaway, the fit's own caveats,
a CSV without step columns, the hold-out prediction interval, the plots, and the MLflow fit run."""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd
import pytest

from diffsweep.scaling.analysis import FitRequest, analyse
from tests.helpers.badinput import refused
from tests.helpers.cli import run
from tests.scaling.synthetic import SIZES, TRUE_RATIO, ladder


def fit_csv(tmp_path, frame: pd.DataFrame, *args: str, out: str = "out"):
    """``diffsweep fit --csv`` as a user runs it; returns (fit.json, report.md, terminal output)."""
    frame.to_csv(tmp_path / "points.in.csv", index=False)
    r = run("fit", "--csv", "points.in.csv", "--out", out, "--boot", "200", "--no-log", *args, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    return json.loads((tmp_path / out / "fit.json").read_text()), (tmp_path / out / "report.md").read_text(), r.stdout


def first_paragraph(report: str) -> str:
    """The report's opening block (the lines between the title and the first blank line after it)."""
    return report.split("\n\n")[1]


# -- item 2: extrapolation on both sides --------------------------------------------------------

def test_a_candidate_worse_than_the_baseline_is_flagged_as_extrapolated_on_its_own_side(tmp_path):
    """ρ = 1.4 on 0.83–13.1B data: at the largest measured reference the candidate would need about
    18.3B, beyond its own data. The old flag looked only at the reference (inside), so it said no."""
    points = ladder(noise_sd=0.003, seeds=2, rng=np.random.default_rng(1), ratios={"diff_v1": 1.4})
    result, report, terminal = fit_csv(tmp_path, points)
    largest, geomean = result["ratios"]
    assert largest["at"] == SIZES.max() and not largest["extrapolated_reference"]
    assert largest["extrapolated_candidate"] and largest["extrapolated"]
    assert largest["candidate_x"] == pytest.approx(largest["ratio"] * SIZES.max()) and largest["candidate_x"] > SIZES.max()
    assert not geomean["extrapolated"] and not geomean["extrapolated_candidate"]  # 1.4 x 3.1B is inside the data
    assert "Extrapolation**: DIFF V1 at 13.1B (largest measured) (extrapolated: candidate)" in first_paragraph(report)
    assert "| DIFF V1 | 13.1B (largest measured) (extrapolated: candidate) |" in report
    sentence = next(line for line in terminal.splitlines() if line.startswith("DIFF V1 needs") and "13.1B" in line)
    assert re.search(r"DIFF V1 would need 1\d\.\dB, outside its measured range", sentence), sentence
    assert any("the candidate's N at equal loss" in w and "830M-13.1B" in w for w in result["warnings"])


def test_a_reference_beyond_the_baseline_data_is_flagged_on_the_reference_side(tmp_path):
    points = ladder(noise_sd=0.003, seeds=2, rng=np.random.default_rng(1))
    result, report, _ = fit_csv(tmp_path, points, "--at", "30B")
    row = next(r for r in result["ratios"] if r["at"] == 30e9)
    assert row["extrapolated_reference"] and row["extrapolated"]
    assert "30B (extrapolated: reference" in report


# -- the first paragraph, the takeaway, sizes, caveats ----------------------------------------------

def test_the_first_paragraph_says_law_reference_noise_resampling_and_the_takeaway(tmp_path):
    """DIFF V1 at 62% (clearly better), DIFF V2 identical to the Transformer: the takeaway must say
    plainly that V2 shows no detectable difference, and why."""
    points = ladder(noise_sd=0.003, seeds=2, rng=np.random.default_rng(1), ratios={"diff_v1": TRUE_RATIO, "diff_v2": 1.0})
    result, report, terminal = fit_csv(tmp_path, points, "--holdout", "largest")
    opening = first_paragraph(report)
    for needle in ("**Law**: L = E + A·N^-α", ("**Reference**: the ratios are read at 13.1B (largest measured), "
                   "3.11B (geometric mean) of the Transformer's parameters"), "**Noise**: run-to-run noise",
                   "from seed replicates",
                   "**Resampling**: 200 draws of a parametric bootstrap", "**Extrapolation**: none"):
        assert needle in opening, opening
    assert "DIFF V1 needs less than the Transformer at every reference" in opening
    assert ("no detectable difference at this scale between DIFF V2 and the Transformer: every 95% CI contains 100%"
            in opening)
    assert "Takeaway: no detectable difference at this scale between DIFF V2" in terminal
    # sizes one way everywhere (1.31M, not 1.311e+06)
    assert "| DIFF V1 | 830M |" in report and "held out DIFF V1 at 13.1B" in terminal
    body = report.split("## Ratios")[1].split("## Diagnostics")[0] + report.split("## Held-out")[1]
    assert not re.search(r"\d\.\d+e[+-]\d\d", body), body
    # the hold-out check is a labelled prediction interval, with the curve band beside it
    assert "| architecture | x | predicted | prediction interval | curve band | observed | error |" in report
    assert all(p["lo"] < p["curve_lo"] and p["hi"] > p["curve_hi"] for p in result["holdout"]["predictions"].values())
    assert result["holdout"]["interval"] == "prediction"


def test_a_fit_on_a_bound_is_a_warning_in_the_terminal_and_the_first_paragraph(tmp_path):
    """DIFF V2 follows a pure power law (no floor): its fitted E goes to the lower bound, as on the
    README's demo; that must not hide in the diagnostics table."""
    points = ladder(noise_sd=0.002, seeds=2, rng=np.random.default_rng(3))
    pure = points[points["arch"] == "transformer"].assign(arch="diff_v2")
    pure["loss"] = 30.0 * pure["num_params"] ** -0.12 * np.exp(0.002 * np.random.default_rng(4).standard_normal(len(pure)))
    result, report, terminal = fit_csv(tmp_path, pd.concat([points, pure], ignore_index=True))
    assert result["fits"]["diff_v2"]["diagnostics"]["on_bound"] == ["e"]
    warning = next(w for w in result["warnings"] if w.startswith("DIFF V2: the fitted E sits on its lower bound"))
    assert warning in first_paragraph(report).replace("**Fit caveats**: ", "")
    assert "warning: DIFF V2: the fitted E sits on its lower bound" in terminal


# -- item 4: the paper's reading ----------------------------------------------------------------

def test_the_papers_pure_law_reading_at_11b_stands_beside_the_headline(tmp_path):
    points = ladder(noise_sd=0.003, seeds=2, rng=np.random.default_rng(1))
    result, report, terminal = fit_csv(tmp_path, points)
    paper = result["paper_reading"]
    assert paper["available"] and paper["at"] == 11e9 and paper["law"] == "pure"
    (row,) = paper["rows"]
    # the pure law reads high on offset-law data (truth 62%): the bias the paragraph explains
    assert row["pure_law"]["ratio"] > row["this_fit"]["ratio"] and row["pure_law"]["ratio"] > TRUE_RATIO
    assert row["pure_law"]["lo"] < row["pure_law"]["ratio"] < row["pure_law"]["hi"]
    assert "## The paper's reading" in report and "Why the two readings differ" in report
    assert "| DIFF V1 | " + f"{100 * row['pure_law']['ratio']:.2g}% (95% CI" in report
    assert "The paper's reading (pure power law at 11B): DIFF V1" in terminal
    assert "the paper read Kaplan-style pure power laws at 11B" in first_paragraph(report)


def test_the_papers_reference_far_outside_a_tiny_ladder_is_said_not_read(tmp_path):
    points = ladder(noise_sd=0.003, seeds=2, rng=np.random.default_rng(1), sizes=np.array([1e5, 2e5, 4e5, 8e5, 1.6e6]))
    result, report, terminal = fit_csv(tmp_path, points)
    assert not result["paper_reading"]["available"] and result["paper_reading"]["rows"] == []
    assert "The paper's reference cannot be read from these data: 11B is more than 10x outside" in report
    assert "is not available: 11B is more than 10x outside the measured N range 100K-1.6M" in terminal


# -- item 5: a CSV without step columns; the point column ----------------------------------------

def token_scan(step_columns: bool) -> pd.DataFrame:
    """One run per architecture evaluated every 40B tokens (Fig. 3b's shape); warmup covers the first."""
    rows = []
    for arch, rho in (("transformer", 1.0), ("diff_v1", 0.637)):
        for i, d in enumerate(np.arange(1, 10) * 40e9):
            loss = 1.8 + 1500.0 * (d / rho) ** -0.3 * np.exp(0.002 * np.sin(7 * i + rho))
            row = {"arch": arch, "num_params": 3e9, "tokens": d, "loss": loss, "run_name": f"{arch}-3B",
                   "point": "final" if i == 8 else "checkpoint"}
            if step_columns:
                row |= {"step": (i + 1) * 10_000, "warmup_steps": 10_000}
            rows.append(row)
    return pd.DataFrame(rows)


def test_a_csv_without_step_columns_uses_every_checkpoint_and_says_so(tmp_path):
    """Before: every checkpoint row was dropped as 'in warmup' (step 0 <= warmup 0) and the fit
    failed with a message about too few token counts."""
    result, _, _ = fit_csv(tmp_path, token_scan(step_columns=False), "--noise-sd", "0.003")
    assert result["axis"] == "D" and result["points_used"] == 18
    assert any("have no step or warmup_steps" in w and "all are used" in w for w in result["warnings"])
    points = pd.read_csv(tmp_path / "out" / "points.csv")
    assert points["used"].all()
    # with the columns, the evaluation at the end of warmup is left out, as for MLflow runs
    result, _, _ = fit_csv(tmp_path, token_scan(step_columns=True), "--noise-sd", "0.003", out="with-steps")
    assert result["points_used"] == 16
    points = pd.read_csv(tmp_path / "with-steps" / "points.csv")
    assert list(points.loc[~points["used"], "reason"].unique()) == ["in warmup"]


def test_a_point_column_with_other_values_is_refused(tmp_path):
    points = token_scan(step_columns=False)
    points.loc[2, "point"] = "ckpt"
    points.to_csv(tmp_path / "p.csv", index=False)
    r = run("fit", "--csv", "p.csv", "--no-log", "--out", "out", cwd=tmp_path)
    refused(r, "point", "final, checkpoint", "ckpt")
    assert not (tmp_path / "out").exists()


def test_the_csv_schema_is_in_the_help(tmp_path):
    r = run("fit", "--help", cwd=tmp_path, env={"COLUMNS": "200"})
    text = " ".join(r.stdout.replace("│", " ").split())
    for needle in ("Required: arch", "point (final | checkpoint", "step and warmup_steps", "seed (replicates"):
        assert needle in text


# -- the hold-out check: a prediction interval ----------------------------------------------------

@pytest.mark.slow
def test_the_holdout_prediction_interval_covers_the_observed_point():
    """The observed value at the held-out size is one noisy run, not the curve: a 95% interval for it
    must cover ≈95% of the time. The curve's confidence band (the old check) covered 84% here."""
    sizes = np.geomspace(0.2e9, 13.1e9, 10)
    inside, total = 0, 0
    for i in range(60):
        points = ladder(noise_sd=0.005, seeds=1, rng=np.random.default_rng(100 + i), sizes=sizes)
        result = analyse(points, FitRequest(n_boot=200, holdout=True, noise_sd=0.005, seed=i))
        for p in result.holdout["predictions"].values():
            inside += p["lo"] <= p["observed"] <= p["hi"]
            total += 1
    assert inside / total >= 0.89, f"coverage {inside / total:.1%} of {total}"


# -- plots ---------------------------------------------------------------------------------------

def test_ratio_plot_puts_markers_at_the_baseline_equivalent_size_and_shows_what_leaves_the_axis(tmp_path):
    from diffsweep.scaling.plots import ratio_markers, ratio_top, split_measured, write_plots

    points = ladder(noise_sd=0.005, seeds=1, rng=np.random.default_rng(1), ratios={"diff_v1": 1.4})
    result = analyse(points, FitRequest(n_boot=200)).to_dict()
    xs, _ = ratio_markers(result, "diff_v1")
    # at the baseline size that reaches the candidate's loss: x_cand / multiplier, not x_cand
    assert xs == pytest.approx([p["x"] / p["multiplier"] for p in result["per_point"]])
    assert all(x < p["x"] for x, p in zip(xs, result["per_point"]))  # ρ > 1: shifted down, up to 1.4x
    top, beyond = ratio_top(result)
    his = [v for v in result["ratio_curve"]["diff_v1"]["hi"]]
    assert beyond == any(v is None or v > top for v in his) and (top > 2 or not beyond)
    assert beyond  # this band reaches ∞ at the large end: the plot labels the cut instead of clipping at 2
    band, x_range = result["fits"]["diff_v1"]["band"], result["fits"]["diff_v1"]["x_range"]
    _, outside = split_measured(band, x_range)
    assert outside and min(band["x"][i] for i in outside) < x_range[0] and max(band["x"]) > x_range[1]
    assert sorted(write_plots(result, tmp_path / "plots")) == ["loss", "ratio", "residuals"]


# -- one architecture: report, terminal, plots and the fit run -----------------------------------

def single_architecture(result: dict) -> dict:
    """The shape of a single-architecture fit (candidates == [], ratios == []), built from a real fit."""
    base = result["baseline"]
    return result | {"candidates": [], "ratios": [], "ratio_curve": {}, "per_point": [],
                     "fits": {base: result["fits"][base]},
                     "paper_reading": result["paper_reading"] | {"rows": []}, "warnings": []}


def test_a_single_architecture_result_renders_everywhere(tmp_path, store, capsys):
    from diffsweep.scaling.pipeline import Outcome, Source, _log, _write
    from diffsweep.scaling.plots import write_plots
    from diffsweep.scaling.report import markdown, print_terminal

    points = ladder(noise_sd=0.003, seeds=2, rng=np.random.default_rng(1))
    fit = analyse(points, FitRequest(n_boot=100))
    used = fit.points
    r = single_architecture(fit.to_dict()) | {"source": {"csv": "x.csv"}}
    report = markdown(r, "one")
    assert "one architecture only, so the law is reported and no ratio is computed" in report
    assert "## Answer" not in report and "ratio.png" not in report and "## Fitted laws" in report
    print_terminal(r)
    assert "One architecture (Transformer): the law is fitted, no ratio is computed." in capsys.readouterr().out
    assert sorted(write_plots(r, tmp_path / "plots")) == ["loss", "residuals"]
    outcome = Outcome(result=r, folder=tmp_path / "fit")
    source = Source(uri=store["MLFLOW_TRACKING_URI"], csv=tmp_path / "x.csv")
    _write(tmp_path / "staged", outcome, used, source)
    from mlflow.tracking import MlflowClient

    logged = MlflowClient(source.uri).get_run(_log(tmp_path / "staged", outcome, used, source, FitRequest(n_boot=100)))
    assert logged.info.status == "FINISHED" and "fit/transformer/alpha" in logged.data.metrics


def run_tag(client, run_id: str) -> str:
    return client.get_run(run_id).data.tags["diffsweep.fit_hash"]


# -- the MLflow fit run: readable metric names, one run per identical fit --------------------------

def test_refitting_identical_inputs_reuses_the_fit_run_and_metric_names_say_their_reference(tmp_path, store):
    from mlflow.tracking import MlflowClient

    points = ladder(noise_sd=0.003, seeds=2, rng=np.random.default_rng(1), ratios={"diff_v1": TRUE_RATIO, "diff_v2": 0.7})
    points.to_csv(tmp_path / "p.csv", index=False)
    ids, reused = [], []
    for _ in range(2):
        r = run("fit", "--csv", "p.csv", "--boot", "100", "--json", "--at", "11B", cwd=tmp_path, env=store)
        assert r.returncode == 0, r.stderr
        ids.append(json.loads(r.stdout)["mlflow_run_id"])
        reused.append(json.loads(r.stdout)["mlflow_run_reused"])
    assert ids[0] == ids[1] and reused == [False, True]  # the same fit twice: one run
    client = MlflowClient(store["MLFLOW_TRACKING_URI"])
    exp = client.get_experiment_by_name("diffsweep-fits")
    assert [run.info.run_id for run in client.search_runs([exp.experiment_id])] == [ids[0]]
    # the identity covers the options: another option is another fit
    from diffsweep.scaling.pipeline import fit_hash

    used = pd.read_csv(tmp_path / "fits" / "p-N" / "points.csv")
    source = json.loads((tmp_path / "fits" / "p-N" / "fit.json").read_text())["source"]
    request = FitRequest(at=(11e9,), n_boot=100)
    assert run_tag(client, ids[0]) == fit_hash(used, request, source)
    assert fit_hash(used, FitRequest(at=(11e9,), n_boot=200), source) != fit_hash(used, request, source)
    fit_run = client.get_run(ids[0])
    for cand in ("diff_v1", "diff_v2"):  # every candidate's ratios, named by their reference
        for ref in ("N_13.1B_largest", "N_3.11B_geomean", "N_11B"):
            assert {f"ratio/{cand}/{ref}/{k}" for k in ("ratio", "lo", "hi")} <= set(fit_run.data.metrics)
    assert fit_run.data.tags["diffsweep.refs"] == ("N_13.1B_largest=13.1B (largest measured); "
                                                   "N_3.11B_geomean=3.11B (geometric mean); N_11B=11B")


def test_a_curve_fit_only_ci_and_the_resampling_used_are_said_in_the_sentence_and_first_paragraph():
    """The fields the noise model sets (``noise.description``, ``noise.ci_scope``, ``resampling``)
    reach the reader: a token scan with one run per architecture must not read as a full CI."""
    from diffsweep.scaling.report import markdown, sentence

    points = ladder(noise_sd=0.003, seeds=2, rng=np.random.default_rng(1))
    r = analyse(points, FitRequest(n_boot=100)).to_dict()
    r["noise"] |= {"description": "the residuals around one curve per architecture (one run each)",
                   "ci_scope": "curve_fit_only"}
    r["resampling"] = {"method": "hierarchical", "unit": "run", "why": "the evaluations of one run share its offset"}
    text = sentence(r, r["ratios"][0])
    assert "95% CI from the curve fit only" in text and "the CI excludes run-to-run variance" in text
    opening = first_paragraph(markdown(r, "scan"))
    assert "**Noise**: the residuals around one curve per architecture (one run each)." in opening
    assert "**The CIs are curve-fit only**" in opening
    assert ("**Resampling**: 100 draws of a hierarchical parametric bootstrap (a per-run offset shared by all "
            "evaluations of a run, plus evaluation noise), because the evaluations of one run share its offset") in opening
