"""Full-model training tokens/s of each architecture at one size, with the ratio to the Transformer.

The same as ``diffsweep bench model`` (same options), e.g.

    python analysis/benchmarks/bench_model.py                          # GPU: 1.4B, T = 2048; CPU: tiny-m
    python analysis/benchmarks/bench_model.py --size 3B --micro-batch 1 --seq 4096
"""

from __future__ import annotations

import sys

from diffsweep.cli.bench import app

if __name__ == "__main__":
    app(["model", *sys.argv[1:]], prog_name="bench_model.py")
