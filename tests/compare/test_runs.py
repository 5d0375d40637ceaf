"""Row differences judged against seed noise (diffsweep.compare.runs): verdicts on Table 6-shaped
synthetic data with a known truth, and the coverage of the CI of a difference (Monte Carlo)."""

from __future__ import annotations

import numpy as np
import pytest

from diffsweep.compare.runs import BEYOND, UNKNOWN, WITHIN, compare_rows
from diffsweep.config import ConfigError

# Paper Table 6 (validation loss at 1.4B), used as the truth; seed sd 0.005 nats is a plausible
# seed-to-seed spread at this scale (the rows' own differences are 0.001-0.004 nats).
TABLE6 = {"transformer-hd_128": 3.087, "transformer-hd_256": 3.088, "transformer-hd_256-gn_on": 3.086,
          "diff_v1-hd_128": 3.062, "diff_v1-hd_128-gn_off": 3.122, "diff_v1-hd_128-lam_0.8": 3.065,
          "diff_v1-hd_128-lam_0.5": 3.066}
SEED_SD = 0.005


def sample(truth: dict[str, float], seeds: int, rng: np.random.Generator) -> dict[str, list[float]]:
    return {row: list(mean + SEED_SD * rng.standard_normal(seeds)) for row, mean in truth.items()}


def spread(truth: dict[str, float]) -> dict[str, list[float]]:
    """Three seeds per row at exactly the truth -/0/+ SEED_SD: each row's mean is its truth and its
    seed sd is SEED_SD, so the verdicts below do not depend on a random draw."""
    return {row: [mean - SEED_SD, mean, mean + SEED_SD] for row, mean in truth.items()}


def test_table6_with_three_seeds_says_which_differences_are_seed_noise():
    c = compare_rows(spread(TABLE6), baseline="diff_v1-hd_128")
    rows = {r.row: r for r in c.rows}
    assert c.df == 14 and c.pooled_sd == pytest.approx(SEED_SD)  # 7 rows x (3 - 1)
    # half-width t(0.975, 14) * 0.005 * sqrt(2/3) = 0.0088 nats
    assert rows["diff_v1-hd_128-lam_0.8"].hi - rows["diff_v1-hd_128-lam_0.8"].lo == pytest.approx(2 * 0.00876, abs=1e-5)
    # 0.003-0.004 nats (the lambda_init rows): within seed noise, and the sentence says so
    for row in ("diff_v1-hd_128-lam_0.8", "diff_v1-hd_128-lam_0.5"):
        assert rows[row].verdict == WITHIN and rows[row].lo < 0 < rows[row].hi
        assert "within seed noise" in rows[row].sentence and "3 seeds vs 3 seeds" in rows[row].sentence
    # 0.06 nats (DIFF without its per-head norm): beyond it, in the right direction
    gn = rows["diff_v1-hd_128-gn_off"]
    assert gn.verdict == BEYOND and 0 < gn.lo < gn.delta < gn.hi and "is higher" in gn.sentence
    assert rows["diff_v1-hd_128"].delta == 0
    # The Transformer rows against each other (0.001-0.002 nats): within seed noise
    t = {r.row: r for r in compare_rows(spread(TABLE6), "transformer-hd_128").rows}
    assert t["transformer-hd_256"].verdict == t["transformer-hd_256-gn_on"].verdict == WITHIN


def test_one_seed_per_row_says_the_noise_is_unknown():
    c = compare_rows({row: [mean] for row, mean in TABLE6.items()}, baseline="transformer-hd_128")
    assert c.pooled_sd is None and c.df == 0
    others = [r for r in c.rows if r.row != "transformer-hd_128"]
    assert all(r.verdict == UNKNOWN and r.lo is None and "one seed per row" in r.sentence for r in others)
    # even a large difference is not called real with one seed per row
    assert next(r for r in others if r.row == "diff_v1-hd_128-gn_off").verdict == UNKNOWN


def test_a_row_with_one_seed_borrows_the_pooled_noise_of_the_others():
    values = {"a": [1.0, 1.01, 0.99], "b": [1.0, 1.02, 0.98], "c": [1.5]}
    c = compare_rows(values, baseline="a")
    rows = {r.row: r for r in c.rows}
    assert c.df == 4 and rows["c"].sd is None and rows["c"].verdict == BEYOND
    assert rows["c"].hi - rows["c"].lo > rows["b"].hi - rows["b"].lo  # 1 seed: a wider interval


@pytest.mark.parametrize("seeds", [2, 3])
def test_ci_of_a_difference_covers_the_truth(seeds):
    """Monte Carlo: 7 Table 6 rows with known means, `seeds` seeds each, seed sd 0.005; 3,000
    replicates. Every row's 95% CI of its difference from the baseline must cover the true
    difference in 93-97% of replicates (a z in place of the t covers 91% with 2 seeds per row, 7 df,
    and fails; so does a rule like "|delta| < 2 pooled sd", which ignores that a mean of n seeds is
    sqrt(n) times less noisy and over-covers)."""
    rng = np.random.default_rng(100 + seeds)
    reps, base = 3000, "diff_v1-hd_128"
    hits = {row: 0 for row in TABLE6 if row != base}
    within_small = 0
    for _ in range(reps):
        c = compare_rows(sample(TABLE6, seeds, rng), baseline=base)
        for r in c.rows:
            if r.row != base:
                hits[r.row] += r.lo <= TABLE6[r.row] - TABLE6[base] <= r.hi
        within_small += next(r for r in c.rows if r.row == "diff_v1-hd_128-lam_0.8").verdict == WITHIN
    coverage = {row: h / reps for row, h in hits.items()}
    assert all(0.93 <= v <= 0.97 for v in coverage.values()), coverage
    assert within_small / reps > 0.5  # a 0.003-nat difference at seed sd 0.005: mostly "within seed noise"


def test_bad_input_is_a_config_error():
    with pytest.raises(ConfigError, match="baseline: expected one of the rows"):
        compare_rows({"a": [1.0]}, baseline="b")
    with pytest.raises(ConfigError, match="row a: expected one finite value per seed"):
        compare_rows({"a": [float("nan")]}, baseline="a")
    with pytest.raises(ConfigError, match="row a: expected one finite value per seed"):
        compare_rows({"a": []}, baseline="a")
