"""A tuned sweep's cells compared at their best candidates (diffsweep.compare.tuned): the winners,
the verdicts, and Monte Carlo coverage of the true best-vs-best difference with the choice of each
best inside the interval, beside the naive reading that ignores the choice."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from diffsweep.compare.runs import BEYOND, UNKNOWN, WITHIN
from diffsweep.compare.tuned import compare_cells
from diffsweep.config import ConfigError

GRID = np.arange(4.0)  # four learning rates an octave apart (log2 positions)
SD = 0.01  # seed sd of a final loss


def bowl(best: float, curve: float, floor: float = 3.0) -> np.ndarray:
    """True mean loss at each grid lr: quadratic in log lr around the arm's own best."""
    return floor + curve * (GRID - best) ** 2


# (baseline truth, other truth): the true best-vs-best difference is min(other) - min(baseline)
SHAPES = {
    "inside": (bowl(1.3, 0.004), bowl(2.0, 0.004) - 0.003),  # optima differ, both inside, gaps ~ noise
    "edge": (bowl(-1.0, 0.004), bowl(2.0, 0.004) - 0.01),  # the baseline's optimum beyond the grid's edge
    "flat": (bowl(1.3, 0.004), np.full(4, 3.005)),  # one arm insensitive to lr: every candidate tied
    "flat8-vs-one": (np.array([3.0]), np.full(8, 3.005)),  # eight tied candidates against one untuned run
}


def sample(truth: np.ndarray, seeds: int, rng: np.random.Generator) -> dict[str, list[float]]:
    return {f"lr{i}": list(mu + SD * rng.standard_normal(seeds)) for i, mu in enumerate(truth)}


def naive_interval(values: dict[str, dict[str, list[float]]], seeds: int) -> tuple[float, float]:
    """The winners' seeds read as if nothing had been chosen: a t interval with the pooled sd."""
    arrays = [np.array(v) for c in values.values() for v in c.values()]
    df = sum(len(v) - 1 for v in arrays)
    sd = np.sqrt(sum(((v - v.mean()) ** 2).sum() for v in arrays) / df)
    a, b = (min(np.mean(v) for v in values[c].values()) for c in ("a", "b"))
    half = stats.t.ppf(0.975, df) * sd * np.sqrt(2 / seeds)
    return b - a - half, b - a + half


def test_each_cell_is_read_at_its_winner_and_differences_are_judged_with_the_choice():
    values = {"transformer": {"lr=1e-3": [3.10, 3.12], "lr=2e-3": [3.05, 3.07], "lr=4e-3": [3.20, 3.22]},
              "diff_v2": {"lr=1e-3": [3.00, 3.02], "lr=2e-3": [2.90, 2.92], "lr=4e-3": [2.95, 2.97]}}
    c = compare_cells(values, "transformer")
    base, v2 = c.cells
    assert (base.winner, v2.winner) == ("lr=2e-3", "lr=2e-3")
    assert base.mean == pytest.approx(3.06) and v2.delta == pytest.approx(2.91 - 3.06)
    assert c.df == 6 and c.pooled_sd == pytest.approx(np.sqrt(2e-4))
    assert v2.verdict == BEYOND and v2.hi < 0 and base.verdict == WITHIN
    assert v2.lo < v2.delta < v2.hi and 0 <= v2.kept <= 1 and v2.bias <= 0
    assert "each at its best: -0.1500 nats" in v2.sentence and "the choice of each best included" in v2.sentence
    assert v2.rivals == 0 and "within its noise" not in v2.sentence  # 2.95 is 2.5 sd of a difference away


def test_a_tie_within_the_noise_widens_the_interval_towards_lower_truths():
    clear = {"a": {"x": [1.0, 1.01]}, "b": {"x": [1.0, 1.01], "y": [1.2, 1.21]}}
    tied = {"a": {"x": [1.0, 1.01]}, "b": {"x": [1.0, 1.01], "y": [1.0, 1.01]}}
    c_clear, c_tied = compare_cells(clear, "a").cells[1], compare_cells(tied, "a").cells[1]
    assert c_clear.rivals == 0 and c_tied.rivals == 1
    assert c_tied.hi > c_clear.hi  # the tied winner may read low: its truth may be higher
    assert "1 other candidate within its noise" in c_tied.sentence


def test_one_seed_per_candidate_says_the_noise_is_unknown():
    c = compare_cells({"a": {"x": [1.0], "y": [1.1]}, "b": {"x": [0.9], "y": [1.2]}}, "a")
    b = c.cells[1]
    assert c.pooled_sd is None and b.verdict == UNKNOWN and b.lo is None and b.winner == "x"
    assert b.delta == pytest.approx(-0.1) and "give the sweep `seeds: 2`" in b.sentence


@pytest.mark.slow
@pytest.mark.parametrize("seeds", [2, 3])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_coverage_of_the_best_vs_best_difference(shape, seeds):
    """Monte Carlo, 1,000 studies per shape: the 95% CI of the best-vs-best difference covers the
    truth (each arm's lowest true mean on its grid) in 90-99% of studies. The naive reading (the
    winners' means in a t interval, as if not chosen) is shown beside it: where eight tied
    candidates face one untuned run it covers under 90% (the winner reads low by ~1.4 sd of a
    candidate's mean), which the selection-aware interval does not."""
    base, other = SHAPES[shape]
    truth = other.min() - base.min()
    rng = np.random.default_rng(7 + seeds)
    reps, hits, naive = 1000, 0, 0
    for _ in range(reps):
        values = {"a": sample(base, seeds, rng), "b": sample(other, seeds, rng)}
        r = compare_cells(values, "a", seed=int(rng.integers(1 << 31))).cells[1]
        hits += r.lo <= truth <= r.hi
        lo, hi = naive_interval(values, seeds)
        naive += lo <= truth <= hi
    assert 0.90 <= hits / reps <= 0.99, (hits / reps, naive / reps)
    if shape == "flat8-vs-one":
        assert naive / reps < 0.90 < hits / reps


def test_bad_input_is_a_config_error():
    with pytest.raises(ConfigError, match="baseline: expected one of the cells"):
        compare_cells({"a": {"x": [1.0]}}, "b")
    with pytest.raises(ConfigError, match="cell a, x: expected one finite value per seed"):
        compare_cells({"a": {"x": [float("inf")]}}, "a")
    with pytest.raises(ConfigError, match="cell a: expected at least one candidate"):
        compare_cells({"a": {}}, "a")
