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


def test_procprof_records_each_python_process_with_its_test(tmp_path):
    """analysis/benchmarks/procprof_site: every Python process writes a line as it exits, naming the
    test that started it; procprof.py sums them by kind, file and test."""
    (tmp_path / "test_y.py").write_text(
        "import subprocess, sys\n"
        "def test_two_children():\n"
        "    for _ in range(2):\n"
        "        subprocess.run([sys.executable, '-c', 'x = sum(i * i for i in range(1_000_000))'], check=True)\n")
    out = tmp_path / "procs.jsonl"
    outer = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env = {**outer, "PYTHONPATH": str(ROOT / "analysis/benchmarks/procprof_site"), "PROCPROF_FILE": str(out)}
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "test_y.py"], cwd=tmp_path,
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    children = [row for row in rows if row["test"] == "test_y.py::test_two_children (call)"]
    assert len(children) == 2 and all(row["argv"][0] == "-c" and row["cpu"] > 0.01 for row in children), rows
    assert any(row["test"] == "" for row in rows)  # pytest itself, outside any test
    report = subprocess.run([sys.executable, str(ROOT / "analysis/benchmarks/procprof.py"), str(out)],
                            capture_output=True, text=True, timeout=60)
    assert report.returncode == 0, report.stderr
    assert report.stdout.startswith(f"{len(rows)} processes, ") and "test_y.py::test_two_children\n" in report.stdout
