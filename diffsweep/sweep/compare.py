"""Differences between a sweep's rows, judged against seed-to-seed noise.

Table 6's rows differ by 0.001-0.004 nats in the paper, which is about what two seeds of one row
differ by; a comparison that prints the differences without the noise invites a wrong reading.
Given each row's values over its seed replicates (e.g. the final ``val/loss`` of
``diff_v1-1.4B-hd_128-s0``, ``-s1``, ``-s2``), ``compare_rows`` gives every row's mean and seed sd,
and each row's difference from a baseline row with a confidence interval from the seed
replicates and a verdict in words:

- the seed sd is pooled over all rows that have at least two seeds (df = sum of n_i - 1): every
  row is assumed to have the same seed-to-seed spread, which pools 14 df out of 7 rows x 3 seeds
  where one row alone would have 2;
- the CI of ``mean(row) - mean(baseline)`` is Student's t: ``delta +- t(df) * s * sqrt(1/n_row +
  1/n_base)``. It treats the rows' seeds as independent (unpaired), which holds whether or not the
  same seed gives two rows the same data order; pairing could only narrow it;
- "within seed noise" when the CI contains 0 (the sign of the difference is not established),
  "beyond seed noise" otherwise, and "seed noise unknown" when no row has two seeds: then no CI
  is given, since one run per row cannot separate a difference from a seed's luck.

Coverage of these CIs is checked by a Monte Carlo test (tests/sweep/test_compare.py).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from diffsweep.config import ConfigError

WITHIN = "within seed noise"
BEYOND = "beyond seed noise"
UNKNOWN = "seed noise unknown"


@dataclass(frozen=True, kw_only=True)
class RowDifference:
    """One row against the baseline row."""

    row: str
    n: int  # seed replicates of this row
    mean: float
    sd: float | None  # this row's own seed sd (None with one seed)
    delta: float  # mean(row) - mean(baseline)
    lo: float | None  # CI of delta; None when the seed noise is unknown
    hi: float | None
    verdict: str  # WITHIN, BEYOND or UNKNOWN (the baseline row itself: WITHIN, delta 0)
    sentence: str


@dataclass(frozen=True, kw_only=True)
class RowComparison:
    """Every row against ``baseline``, with the pooled seed sd the verdicts rest on."""

    baseline: str
    level: float
    pooled_sd: float | None  # None: no row has two seeds
    df: int
    rows: tuple[RowDifference, ...]


def compare_rows(values: Mapping[str, Sequence[float]], baseline: str, level: float = 0.95,
                 unit: str = "nats") -> RowComparison:
    """Each row's mean over its seeds and its difference from ``baseline`` with a ``level`` CI
    from the pooled seed sd (see the module docstring). ``values`` maps a row name to its values,
    one per seed. Raises ``ConfigError`` for an unknown baseline, an empty row or a non-finite value."""
    from scipy import stats

    if baseline not in values:
        raise ConfigError("--baseline", f"expected one of the rows [{', '.join(values)}], got {baseline!r}")
    if not 0 < level < 1:
        raise ConfigError("--level", f"expected a confidence level in (0, 1), got {level}")
    for row, vals in values.items():
        if len(vals) == 0 or not all(math.isfinite(float(v)) for v in vals):
            raise ConfigError(f"row {row}", f"expected one finite value per seed, got {list(vals)!r}")
    means = {row: sum(map(float, vals)) / len(vals) for row, vals in values.items()}
    ss = {row: sum((float(v) - means[row]) ** 2 for v in vals) for row, vals in values.items()}
    df = sum(len(vals) - 1 for vals in values.values())
    pooled = math.sqrt(sum(ss.values()) / df) if df > 0 else None
    t = float(stats.t.ppf(0.5 + level / 2, df)) if df > 0 else math.nan
    n_base = len(values[baseline])
    out = []
    for row, vals in values.items():
        n = len(vals)
        own_sd = math.sqrt(ss[row] / (n - 1)) if n > 1 else None
        delta = means[row] - means[baseline]
        if row == baseline:
            out.append(RowDifference(row=row, n=n, mean=means[row], sd=own_sd, delta=0.0, lo=None, hi=None,
                                     verdict=WITHIN, sentence=f"{row}: the baseline ({_seeds(n)})."))
            continue
        if pooled is None:
            out.append(RowDifference(
                row=row, n=n, mean=means[row], sd=own_sd, delta=delta, lo=None, hi=None, verdict=UNKNOWN,
                sentence=(f"{row} - {baseline}: {delta:+.4f} {unit}; {UNKNOWN}: one seed per row, so this "
                          "difference cannot be told apart from seed-to-seed variation (run >= 2 seeds per row).")))
            continue
        half = t * pooled * math.sqrt(1 / n + 1 / n_base)
        lo, hi = delta - half, delta + half
        verdict = WITHIN if lo <= 0 <= hi else BEYOND
        why = ("the CI contains 0, so the sign of the difference is not established" if verdict == WITHIN
               else f"the CI excludes 0: {row} is {'higher' if delta > 0 else 'lower'}")
        out.append(RowDifference(
            row=row, n=n, mean=means[row], sd=own_sd, delta=delta, lo=lo, hi=hi, verdict=verdict,
            sentence=(f"{row} - {baseline}: {delta:+.4f} {unit} ({level:.0%} CI {lo:+.4f} to {hi:+.4f}; "
                      f"{_seeds(n)} vs {_seeds(n_base)}, pooled seed sd {pooled:.4f} on {df} df): {verdict}; {why}.")))
    return RowComparison(baseline=baseline, level=level, pooled_sd=pooled, df=df, rows=tuple(out))


def _seeds(n: int) -> str:
    return f"{n} seed{'s' if n != 1 else ''}"
