"""How long `diffsweep plan` takes on a 10,000-run grid (target: <= 1 s).

Times, in one process run: the sweep's expansion (validation of every run, keys, counts) and the
whole plan (expansion + estimates + states), then `diffsweep plan --json` end to end in a fresh
process (start-up, imports, printing 10,200 rows). Usage:

    python analysis/benchmarks/bench_plan.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SWEEP = """
name: bench-10k
grid:
  model.size: [tiny-xs, tiny-s, tiny-m, tiny-l, 830M]
  model.attention.kind: [transformer, diff_v1, diff_v2]
  train.lr: [{lrs}]
set: {{train.min_lr: 0.0}}
seeds: 34
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    from diffsweep.launch.planning import make_plan
    from diffsweep.launch.profiles import LOCAL
    from diffsweep.sweep import expand, load_sweep

    with tempfile.TemporaryDirectory() as tmp, contextlib.chdir(tmp):  # relative paths as the CLI's (run in tmp)
        path = Path(tmp) / "bench.yaml"
        path.write_text(SWEEP.format(lrs=", ".join(f"{(i + 4) * 1e-4:.1e}" for i in range(20))))
        spec = load_sweep(path)
        n = len(expand(spec).runs)
        expand_s, plan_s, cli_s = [], [], []
        for _ in range(args.repeat):
            t = time.perf_counter()
            expand(load_sweep(path))
            expand_s.append(time.perf_counter() - t)
            t = time.perf_counter()
            make_plan(load_sweep(path), LOCAL, Path(tmp) / "out")
            plan_s.append(time.perf_counter() - t)
            t = time.perf_counter()
            subprocess.run([sys.executable, "-m", "diffsweep", "plan", str(path), "--executor", "local", "--json"],
                           cwd=tmp, check=True, capture_output=True)
            cli_s.append(time.perf_counter() - t)
    print(f"runs: {n}")
    for label, xs in (("expand (in process)", expand_s), ("plan (in process)", plan_s),
                      ("`diffsweep plan --json` (fresh process)", cli_s)):
        print(f"{label:42s} median {statistics.median(xs):.3f} s  min {min(xs):.3f} s  ({len(xs)} runs)")


if __name__ == "__main__":
    main()
