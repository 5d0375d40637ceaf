"""Time from `diffsweep launch` to every job submitted, for a 100-run sweep on a real Slurm
(the localhost cluster of slurm/start-cluster.sh). The jobs are cancelled right after.

    bash slurm/start-cluster.sh && source /tmp/diffsweep-slurm/env.sh
    python analysis/benchmarks/bench_launch.py --data data/demo [--runs 100] [--repeat 3]

Reported: the launch command's wall time (fresh process: start-up, expansion, checks, MLflow
experiment, code snapshot, sbatch of the arrays, ledger), and the same with --dry-run (no sbatch)
to show where the time goes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", type=Path, required=True, help="a prepared dataset (bpe 4096), e.g. data/demo")
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    profile = Path(__file__).resolve().parents[2] / "slurm" / "profiles" / "localhost.yaml"
    seeds = args.runs // 2
    real, dry = [], []
    for _ in range(args.repeat):
        with tempfile.TemporaryDirectory() as tmp:
            sweep = Path(tmp) / "bench.yaml"
            sweep.write_text(f"name: bench-launch\nset: {{model.size: tiny-xs, data.path: {args.data.resolve()}, "
                             f"train.max_steps: 100}}\ngrid: {{model.attention.kind: [transformer, diff_v1]}}\n"
                             f"seeds: {seeds}\n")
            env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp}/mlflow.db"}
            cmd = [sys.executable, "-m", "diffsweep", "launch", str(sweep), "--profile", str(profile)]
            t = time.perf_counter()
            subprocess.run(cmd + ["--dry-run"], cwd=tmp, env=env, check=True, capture_output=True)
            dry.append(time.perf_counter() - t)
            t = time.perf_counter()
            out = subprocess.run(cmd, cwd=tmp, env=env, check=True, capture_output=True, text=True)
            real.append(time.perf_counter() - t)
            ledger = json.loads((Path(tmp) / "runs" / "bench-launch" / "ledger.json").read_text())
            ids = {a["job_id"].split("_")[0] for e in ledger["entries"].values() for a in e["attempts"]}
            assert len(ledger["entries"]) == 2 * seeds, out.stdout
            subprocess.run(["scancel", *sorted(ids)], check=True)
            time.sleep(2)
    print(f"runs: {2 * seeds}")
    print(f"launch --dry-run (no sbatch)        median {statistics.median(dry):.2f} s  min {min(dry):.2f} s")
    print(f"launch (all jobs submitted)         median {statistics.median(real):.2f} s  min {min(real):.2f} s")


if __name__ == "__main__":
    main()
