"""Where the test suite's CPU goes: a passive pytest plugin recording each test's CPU seconds (the
worker's own, and its reaped children's, from ``getrusage``) and wall seconds, one JSON file per
xdist worker in ``$CPUPROF_DIR`` (default /tmp/cpuprof); run as a script, it sums them by file.

    PYTHONPATH=analysis/benchmarks PYTEST_ADDOPTS="-p cpuprof" python -m pytest -n 3 --dist loadgroup
    python3 analysis/benchmarks/cpuprof.py

Children's CPU lands on the test during which they were reaped (a server started in a fixture
counts where it is stopped): trust the per-file sums more than single tests.
"""

from __future__ import annotations

import collections
import glob
import json
import os
import resource
import time

import pytest

OUT = os.environ.get("CPUPROF_DIR", "/tmp/cpuprof")
_rows: list[tuple[str, float, float, float]] = []


def _cpu() -> tuple[float, float]:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    own, children = _cpu()
    start = time.monotonic()
    yield
    own_after, children_after = _cpu()
    _rows.append((item.nodeid, own_after - own, children_after - children, time.monotonic() - start))


def pytest_sessionfinish(session):
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, f"rows-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}.json"), "w") as f:
        json.dump(_rows, f)


def report(top: int = 30) -> None:
    rows = [row for path in glob.glob(os.path.join(OUT, "rows-*.json")) for row in json.load(open(path))]
    print(f"{len(rows)} tests: {sum(r[1] for r in rows):.0f} CPU-s in the workers, "
          f"{sum(r[2] for r in rows):.0f} in reaped children, {sum(r[3] for r in rows):.0f} s of wall time")
    by_file: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0.0, 0])
    for nodeid, own, children, wall in rows:
        entry = by_file[nodeid.split("::")[0]]
        entry[0], entry[1], entry[2], entry[3] = entry[0] + own, entry[1] + children, entry[2] + wall, entry[3] + 1
    print("  CPU-s    own  child   wall tests file")
    for path, (own, children, wall, n) in sorted(by_file.items(), key=lambda kv: -(kv[1][0] + kv[1][1]))[:top]:
        print(f"{own + children:7.0f} {own:6.0f} {children:6.0f} {wall:6.0f} {n:5d} {path}")


if __name__ == "__main__":
    report()
