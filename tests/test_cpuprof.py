"""analysis/benchmarks/cpuprof.py, the plugin that measures where the suite's CPU goes (issue #30):
each test's row is written, a busy child's CPU lands on its test, and the report sums by file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_rows_per_test_and_the_report_by_file(tmp_path):
    (tmp_path / "test_x.py").write_text(
        "import subprocess, sys\n"
        "def test_busy_child():\n"
        "    subprocess.run([sys.executable, '-c', 'x = sum(i * i for i in range(3_000_000))'], check=True)\n"
        "def test_idle():\n"
        "    pass\n")
    outer = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}  # an xdist worker's PYTEST_XDIST_WORKER
    env = {**outer, "PYTHONPATH": str(ROOT / "analysis/benchmarks"), "CPUPROF_DIR": str(tmp_path / "out")}
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "cpuprof", "-p", "no:cacheprovider", "-q", "test_x.py"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = {nodeid: (own, children, wall) for nodeid, own, children, wall in
            json.loads((tmp_path / "out" / "rows-main.json").read_text())}
    assert list(rows) == ["test_x.py::test_busy_child", "test_x.py::test_idle"]
    assert rows["test_x.py::test_busy_child"][1] > 0.05 and rows["test_x.py::test_idle"][1] == 0
    report = subprocess.run([sys.executable, str(ROOT / "analysis/benchmarks/cpuprof.py")], env=env,
                            capture_output=True, text=True, timeout=60)
    assert report.returncode == 0, report.stderr
    assert report.stdout.startswith("2 tests: ") and report.stdout.splitlines()[-1].endswith("    2 test_x.py")
