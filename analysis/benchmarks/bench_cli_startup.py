"""Wall time of ``diffsweep --help`` and a few commands against bare ``python -c pass``, interleaved
in one run; with ``--checkout DIR`` (repeatable) each command runs from each checkout in turn (DIR
first on PYTHONPATH), so that a change's start-up cost is measured side by side with the commit
before it.

    python analysis/benchmarks/bench_cli_startup.py [--runs 20] [--checkout DIR ...]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

COMMANDS = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "python -m diffsweep --help": [sys.executable, "-m", "diffsweep", "--help"],
    "python -m diffsweep model info --help": [sys.executable, "-m", "diffsweep", "model", "info", "--help"],
    "python -m diffsweep model info --size 1.4B --json": [
        sys.executable, "-m", "diffsweep", "model", "info", "--size", "1.4B", "--json"],
    "python -m diffsweep config show --arch diff_v1": [
        sys.executable, "-m", "diffsweep", "config", "show", "--size", "tiny-xs", "--arch", "diff_v1"],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--checkout", action="append", default=[], help="run each command from this checkout too")
    args = parser.parse_args()
    sources = args.checkout or [None]
    times: dict[tuple[str, str | None], list[float]] = {(n, s): [] for n in COMMANDS for s in sources}
    for _ in range(args.runs):
        for name, cmd in COMMANDS.items():
            for source in sources:
                env = dict(os.environ)
                if source is not None:
                    env["PYTHONPATH"] = os.pathsep.join(filter(None, [source, env.get("PYTHONPATH")]))
                t0 = time.perf_counter()
                subprocess.run(cmd, check=True, capture_output=True, env=env)
                times[name, source].append(time.perf_counter() - t0)
    print(f"{'command':50} {'checkout':24} {'median s':>9} {'min s':>7} {'over bare python':>17}")
    for (name, source), ts in times.items():
        base = statistics.median(times["python -c pass", source])
        med = statistics.median(ts)
        print(f"{name:50} {str(source or '.')[-24:]:24} {med:>9.3f} {min(ts):>7.3f} {med - base:>+16.3f}s")


if __name__ == "__main__":
    main()
