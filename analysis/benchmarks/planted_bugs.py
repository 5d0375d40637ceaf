"""The Monte Carlo acceptance tests against planted bugs: each bug is a one-line edit of the
product, made in a throw-away clone of this repository's HEAD; every test must fail on at least
one of them (issue #30: a test at the smallest size that still separates right from wrong).
Run it with the project's venv active: the clone's tests run on this Python.

    python3 analysis/benchmarks/planted_bugs.py              # every bug (~25 min on 2 cores)
    python3 analysis/benchmarks/planted_bugs.py P1 P8        # these bugs only ("none": the clean clone)

Prints one JSON line per bug (which tests failed) and each failure's assertion line.
Results: analysis/benchmarks/RESULTS.md, "The test suite", "Monte Carlo tests against planted bugs".
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = {
    "T1": "tests/scaling/test_bootstrap.py::test_ratio_ci_covers_the_truth_about_95_percent_of_the_time",
    "T2": "tests/scaling/test_bootstrap.py::"
          "test_one_seed_ladder_ci_is_calibrated_and_only_as_wide_as_its_noise_estimate_warrants",
    "T3": "tests/scaling/test_chinchilla.py::test_case_resampling_covers_on_a_chinchilla_grid",
    "T4": "tests/scaling/test_chinchilla_cluster.py::test_cluster_resampling_is_chosen_and_covers_with_run_level_offsets",
    "T5": "tests/scaling/test_fit_report.py::test_the_holdout_prediction_interval_covers_the_observed_point",
    "T6": "tests/scaling/test_shift.py::test_on_parallel_noisy_ladders_the_test_rarely_rejects_and_the_ci_covers",
    "T7": "tests/scaling/test_run_noise.py::test_token_scan_ci_covers_the_truth_with_run_offsets",
    "T8": "tests/scaling/test_suggest.py::test_following_suggest_narrows_the_ci_more_per_gpu_hour_than_uniform_runs",
}
BOOT, ANALYSIS, SUGGEST = "diffsweep/scaling/fitting/bootstrap.py", "diffsweep/scaling/analysis.py", "diffsweep/scaling/suggest/preposterior.py"
NOISE = "rng.standard_normal((n_boot, n)) * scales.sd"
PICK = "best = max(scored, key=lambda s: (_key(s.per_gpu_hour), -s.candidate.gpu_hours))"
# name: (file, the line's text, its replacement)
PLANTS: dict[str, tuple[str, str, str] | None] = {
    "none": None,
    "P1 an 80% interval reported as 95%": (BOOT, "tail = (1.0 - level) / 2.0", "tail = (1.0 - level) * 2.0"),
    "P2 the simulated noise halved": (BOOT, NOISE, NOISE.replace("* scales.sd", "* (0.5 * scales.sd)")),
    "P3 the simulated noise doubled": (BOOT, NOISE, NOISE.replace("* scales.sd", "* (2.0 * scales.sd)")),
    "P4 run offsets not simulated": (BOOT, "if np.any(scales.run > 0) and run is not None:", "if False:"),
    "P5 cluster draws points, not runs": (ANALYSIS, 'runs[a] if resampling.unit == "run" else np.arange(len(arch.x))',
                                          "np.arange(len(arch.x))"),
    "P6 the hold-out interval without the observation's noise": (ANALYSIS, "obs = quantile * float(",
                                                                "obs = 0.0 * quantile * float("),
    "P7 the shift test's chi-square statistic doubled": ("diffsweep/scaling/shift.py",
                                                         "p_value = float(chi2.sf(stat, df))",
                                                         "p_value = float(chi2.sf(2.0 * stat, df))"),
    "P8 case draws are the data itself": ("diffsweep/scaling/fitting/resample.py",
                                          "drawn = rng.integers(0, k, size=(n_boot, k))",
                                          "drawn = np.tile(np.arange(k), (n_boot, 1))"),
    "P9 an estimated sd doubled": (BOOT, "return (sd * np.sqrt(dof / rng.chisquare(dof, n_boot)))[:, None]",
                                   "return (2.0 * sd * np.sqrt(dof / rng.chisquare(dof, n_boot)))[:, None]"),
    "P10 suggest takes the first affordable candidate": (SUGGEST, PICK, "best = scored[0]"),
    "P11 suggest takes the worst per GPU-hour": (SUGGEST, PICK, PICK.replace("max(", "min(")),
}


def run(clone: Path, name: str, edit: tuple[str, str, str] | None) -> dict:
    subprocess.run(["git", "checkout", "-q", "--", "."], cwd=clone, check=True)
    if edit:
        path, old, new = clone / edit[0], edit[1], edit[2]
        text = path.read_text()
        if text.count(old) != 1:
            raise SystemExit(f"error: {name}: the line {old!r} is not once in {edit[0]}")
        path.write_text(text.replace(old, new))
    result = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rf", "--tb=line",
                             *TESTS.values()], cwd=clone, capture_output=True, text=True,
                            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(clone), "HOME": str(Path.home()),
                                 "OMP_NUM_THREADS": "1"})
    failed = sorted({k for k, t in TESTS.items() for line in result.stdout.splitlines()
                     if line.startswith(f"FAILED {t}")})
    lines = [line for line in result.stdout.splitlines()
             if line.startswith(str(clone)) and ("Error" in line or "assert" in line)]
    return {"plant": name, "failed": failed, "summary": result.stdout.strip().splitlines()[-1], "lines": lines}


def main(only: list[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        clone = Path(tmp) / "clone"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
        for name, edit in PLANTS.items():
            if only and name.split()[0] not in only:
                continue
            row = run(clone, name, edit)
            lines = row.pop("lines")
            print(json.dumps(row), flush=True)
            for line in lines:
                print("   ", line.replace(str(clone) + "/", "")[:300], flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
