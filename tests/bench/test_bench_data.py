"""``analysis/benchmarks/bench_data.py --quick``: run as a user runs it (a subprocess, on the demo
corpus in data/sources, fetched once by `diffsweep data fetch-demo`). No timed assertions: only
that every table and every field is there, finite and positive, and the ratios follow from them.

The quick run is a process of its own: the script's spawn pools start workers that import the
script's functions from ``__main__``, which only a script run gives. Its refusal of missing sources
is checked in this process, through its ``main``."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from diffsweep.config import ConfigError
from diffsweep.data.demo import DEMO_SOURCES, source_files

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "analysis/benchmarks/bench_data.py"


def _positive(x) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) and x > 0


@pytest.mark.slow
def test_quick_run_prints_and_writes_every_field(tmp_path):
    sources = ROOT / DEMO_SOURCES
    try:
        source_files(sources)
    except ConfigError as e:
        pytest.fail(f"{e}\nrun `diffsweep data fetch-demo` (from {ROOT}) once to get the demo sources")
    out = tmp_path / "data.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    r = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--sources", str(sources), "--json", str(out)],
                       capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)  # a hang guard: 120 s was hit under load
    assert r.returncode == 0, r.stderr
    for text in ("quick: a 1 MB slice", "## 1. data prepare", "## 2. projection", "## 3. loader", "| cl100k_base |", "| bpe |",
                 "target >= 1.8x", "target >= 100x", "16 shards", "1 shard", "40% MFU of 989 TFLOP/s",
                 "6N FLOPs/token", "64-core node", "16 tasks x 32 cores", "bpe stage (training)"):
        assert text in r.stdout, text
    data = json.loads(out.read_text())
    assert data["assumptions"]["quick"] is True and data["assumptions"]["paper_tokens"] == [10.5e9, 360e9]

    assert [row["tokenizer"] for row in data["prepare"]] == ["cl100k_base", "bpe"]
    for row in data["prepare"]:
        assert row["shards"] == 4 and row["identical_for_1_and_2_workers"] is True
        for field in ("tokens", "text_bytes", "bytes_per_token", "stage_s", "finish_s", "encode_tokens_per_s",
                      "write_s_w1", "write_s_w2", "tokens_per_s_per_worker_w1", "tokens_per_s_per_worker_w2",
                      "speedup_2v1", "parallel_efficiency"):
            assert _positive(row[field]), (row["tokenizer"], field, row[field])
        for field in ("startup_s_w1", "startup_s_w2"):
            assert row[field] >= 0, (field, row[field])
        # A steady figure is left out (None) when start-up is not well below the write time.
        for field in ("steady_tokens_per_s_per_worker_w1", "steady_tokens_per_s_per_worker_w2", "steady_speedup_2v1"):
            assert row[field] is None or _positive(row[field]), (field, row[field])
        assert row["tokens_per_s_per_worker_w2"] == pytest.approx(row["tokens"] / row["write_s_w2"] / 2)
        assert row["speedup_2v1"] == pytest.approx(row["write_s_w1"] / row["write_s_w2"])
        assert row["efficiency_from"] in ("steady", "end-to-end")

    assert [p["tokenizer"] for p in data["projection"]] == ["cl100k_base", "bpe"]
    for p in data["projection"]:
        assert (p["node_workers"], p["array_workers"]) == (64, 16 * 32)
        for layout in ("node", "array"):
            rate = p[f"{layout}_tokens_per_s"]
            assert rate == pytest.approx(p[f"{layout}_workers"] * p["per_worker_tokens_per_s"] * p["parallel_efficiency"])
            for budget in ("10.5B", "360B"):
                assert _positive(p[f"{layout}_hours_{budget}"]) and _positive(p[f"{layout}_read_MBps_{budget}"])
            assert p[f"{layout}_hours_360B"] == pytest.approx(360e9 / rate / 3600)

    loader, h100 = data["loader"], data["h100"]
    assert (loader["seq_len"], loader["shards"], loader["dtype"]) == (2048, 16, "uint32")  # cl100k needs uint32
    assert h100["tokens_per_s"] == pytest.approx(0.4 * 989e12 / (6 * 1.4e9))
    assert h100["windows_per_s"] == pytest.approx(h100["tokens_per_s"] / 2048)
    for key in ("many_shards", "one_shard"):
        assert _positive(loader[f"windows_per_s_{key}"])
        assert loader[f"ratio_{key}"] == pytest.approx(loader[f"windows_per_s_{key}"] / h100["windows_per_s"])


def test_missing_sources_is_one_line(tmp_path, monkeypatch):
    """``sys.exit`` with the message: Python prints it on stderr and exits 1, with no traceback."""
    spec = importlib.util.spec_from_file_location("bench_data_under_test", SCRIPT)
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), "--quick", "--sources", str(tmp_path)])
    with pytest.raises(SystemExit) as exited:
        script.main()
    message = exited.value.code
    assert isinstance(message, str) and message.startswith("error: ") and "fetch-demo" in message, message
    assert "\n" not in message
