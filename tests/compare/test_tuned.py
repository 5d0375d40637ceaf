"""A tuned sweep's cells compared at their best candidates (diffsweep.compare.tuned): the winners,
the verdicts, and Monte Carlo coverage of the true best-vs-best difference with the choice of each
best inside the interval, beside the naive reading that ignores the choice."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from diffsweep.compare.runs import BEYOND, UNKNOWN, WITHIN
from diffsweep.compare.tuned import compare_cells
from diffsweep.config import ConfigError

# the Monte Carlo's synthetic studies, shared with the benchmark that prints the same figures at length
_SPEC = importlib.util.spec_from_file_location(
    "coverage_tuned_compare",
    Path(__file__).resolve().parents[2] / "analysis" / "benchmarks" / "coverage_tuned_compare.py")
assert _SPEC is not None and _SPEC.loader is not None
bench = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(bench)


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
@pytest.mark.parametrize("shape", list(bench.SHAPES))
def test_coverage_of_the_best_vs_best_difference(shape, seeds):
    """Monte Carlo, 1,000 studies per shape (analysis/benchmarks/coverage_tuned_compare.py): the
    95% CI of the best-vs-best difference covers the truth (each arm's lowest true mean on its grid)
    in 90-99% of studies. The naive reading (the winners' means in a t interval, as if not chosen)
    beside it: where eight tied candidates face one untuned run it reads ~1.4 sd of a candidate's
    mean low and covers under 91%, which the selection-aware interval does not."""
    c = bench.coverage(shape, seeds, reps=1000, seed=7 + seeds)
    assert 0.90 <= c["compare"] <= 0.99, c
    if shape == "flat8-vs-one":
        assert c["naive"] < 0.91 < c["compare"] and c["naive_bias"] < -0.007, c


def test_bad_input_is_a_config_error():
    with pytest.raises(ConfigError, match="baseline: expected one of the cells"):
        compare_cells({"a": {"x": [1.0]}}, "b")
    with pytest.raises(ConfigError, match="cell a, x: expected one finite value per seed"):
        compare_cells({"a": {"x": [float("inf")]}}, "a")
    with pytest.raises(ConfigError, match="cell a: expected at least one candidate"):
        compare_cells({"a": {}}, "a")
