"""Attention alone: baseline vs DIFF V1 (each backend) vs DIFF V2, forward and forward+backward.

The same as ``diffsweep bench attention`` (same options), e.g.

    python analysis/benchmarks/bench_attention.py                      # GPU: 1.4B and 3B layouts, T = 2K and 4K
    python analysis/benchmarks/bench_attention.py --layout 1.4B --seq 2048 --json
"""

from __future__ import annotations

import sys

from diffsweep.cli.bench import app

if __name__ == "__main__":
    app(["attention", *sys.argv[1:]], prog_name="bench_attention.py")
