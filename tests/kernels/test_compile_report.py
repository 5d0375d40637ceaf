"""The fused kernels compile for H100 (sm_90) on this machine, no GPU needed: Triton's compiler
and the ptxas in its wheel see what the interpreter does not (tl.dot shape rules, shared memory,
registers). Runs in a subprocess because this test session interprets Triton kernels."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("triton", reason="the triton package is not installed (pip install triton)")

SCRIPT = """
import json, sys, torch
from dataclasses import asdict
from diffsweep_kernels import compile_report as cr, triton_diff as td
rows = [cr.compile_preprocess(torch.bfloat16, 256)]
for kernel, configs in cr.CONFIGS.items():
    rows.append(cr.compile_config(kernel, configs[0], torch.bfloat16, 128, 256))
rows.append(cr.compile_config("fwd", td.FWD_CONFIGS[0], torch.float16, 96, 192, group=4))  # 830M heads, GQA
print(json.dumps([asdict(r) | {"fits": r.fits} for r in rows]))
"""


def test_every_kernel_compiles_for_h100_within_its_shared_memory():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [r["kernel"] for r in rows] == ["pre", "fwd", "dkdv", "dq", "fwd"]
    for row in rows:
        assert row["fits"], row
        assert 0 < row["registers"] <= 255, row


def test_report_refuses_to_run_inside_the_interpreter():
    from diffsweep_kernels import triton_diff

    if not triton_diff.INTERPRET:
        pytest.skip("this session compiles Triton kernels for real")
    from diffsweep_kernels import compile_report

    with pytest.raises(RuntimeError, match="without TRITON_INTERPRET"):
        compile_report.compile_preprocess(__import__("torch").bfloat16, 256)
