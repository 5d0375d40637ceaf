"""Sum what ``procprof_site/sitecustomize.py`` recorded: the Python processes a test run started,
their CPU seconds by kind of process, by test file and by test.

    PROCPROF_FILE=/tmp/procprof.jsonl PYTHONPATH=$PWD/analysis/benchmarks/procprof_site \\
        python -m pytest -n 3 --dist loadgroup
    python3 analysis/benchmarks/procprof.py /tmp/procprof.jsonl

The xdist workers are processes too (``-c``, no test); a process started in a fixture counts for
the test whose setup started it.
"""

from __future__ import annotations

import collections
import json
import os
import sys


def kind(argv: list[str]) -> str:
    """``diffsweep train``, ``submitit job``, ``torchrun``, ... from a process's first arguments."""
    if not argv:
        return "?"
    name = os.path.basename(argv[0])
    if name in ("diffsweep", "__main__.py") and "/mlflow/" not in argv[0] and "/pytest/" not in argv[0]:
        return "diffsweep " + next((a for a in argv[1:] if not a.startswith("-")), "")
    if name == "_submit.py":
        return "submitit job"
    if name == "run.py" and "torch/distributed" in argv[0]:
        return "torchrun"
    return name


def report(path: str, top: int = 25) -> None:
    rows = [json.loads(line) for line in open(path)]
    print(f"{len(rows)} processes, {sum(r['cpu'] for r in rows):.0f} CPU-s")
    tables = {"by kind of process": lambda r: kind(r["argv"]),
              "by test file": lambda r: r["test"].split("::")[0] or "(no test: xdist workers, ...)",
              "by test": lambda r: r["test"].rsplit(" ", 1)[0] or "(no test: xdist workers, ...)"}
    for title, key in tables.items():
        sums: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
        for r in rows:
            entry = sums[key(r)]
            entry[0] += 1
            entry[1] += r["cpu"]
        print(f"\n{title}:\n  CPU-s procs")
        for name, (n, cpu) in sorted(sums.items(), key=lambda kv: -kv[1][1])[:top]:
            print(f"{cpu:7.1f} {n:5d} {name}")


if __name__ == "__main__":
    if any(a in ("-h", "--help") for a in sys.argv[1:]):
        print(__doc__)
        sys.exit(0)
    path = sys.argv[1] if len(sys.argv) > 1 else "/tmp/procprof.jsonl"
    if not os.path.isfile(path):
        print(f"error: {path}: no such file (PROCPROF_FILE of a recorded run; --help says how)", file=sys.stderr)
        sys.exit(2)
    report(path)
