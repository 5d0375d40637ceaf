"""The device kit (``analysis/gpu/``) as a user runs it: ``prepare.py`` prints the one command for
the GPU machine, and ``run.py --device cpu`` rehearses every stage of that command here, from a
fresh copy of the checkout (what the device tool sends) with the wheels folder prepared.

The wheels (``.whl/``, ~21 MiB from PyPI) are downloaded by ``.ci/run`` during set-up (tests fetch
nothing); without them the tests that need them skip with the reason, and under
``DIFFSWEEP_REQUIRE_KIT=1`` (CI) fail instead.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.helpers.gpu import skip_or_fail

ROOT = Path(__file__).resolve().parents[1]
PREPARE = ROOT / "analysis/gpu/prepare.py"
STAGES = ["env", "install", "smoke", "train-speed", "tests", "bench-attention", "bench-model", "train",
          "bench-model-triton"]
# pytest -m gpu collects at least this many tests; in the CPU rehearsal those that need CUDA skip
# with their reason, the rest (the fused kernel in Triton's interpreter) pass.
GPU_SELECTION_FLOOR = 110  # 114 on this CPU machine (2026-11-27); tests/test_gpu_selection.py asserts the full count


def _clean_env(**extra: str) -> dict[str, str]:
    """The environment of a user's shell: nothing the test session set for itself."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "DIFFSWEEP_", "PYTEST_"))
           and k not in ("TRITON_INTERPRET", "PYTHONPATH")}
    return {**env, **extra}


def require_wheels() -> Path:
    wheels = ROOT / ".whl"
    if not any(wheels.glob("*.whl")):
        skip_or_fail(".whl/ is not prepared (python3 analysis/gpu/prepare.py downloads the wheels; .ci/run does)",
                     require_env="DIFFSWEEP_REQUIRE_KIT")
    return wheels


def fresh_checkout(tmp_path: Path) -> Path:
    """What a device call sends: the tracked and untracked-not-ignored files, plus ``.whl``."""
    copy = tmp_path / "checkout"
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            capture_output=True, text=True, check=True).stdout
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, copy / name)
    shutil.copytree(require_wheels(), copy / ".whl")
    return copy


def kit(checkout: Path, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(checkout / "analysis/gpu/run.py"), *args], cwd=checkout,
                          capture_output=True, text=True, timeout=timeout, env=_clean_env())


def test_prepare_checks_the_wheels_offline_and_prints_the_command():
    require_wheels()
    done = subprocess.run([sys.executable, str(PREPARE), "--offline", "--json"], capture_output=True, text=True,
                          timeout=300, env=_clean_env())
    assert done.returncode == 0, done.stderr
    facts = json.loads(done.stdout)
    assert facts["carry"] == [".whl"] and len(facts["command"]) <= 2000
    assert "analysis/gpu/run.py" in facts["command"] and "$OUT" in facts["command"]
    assert f"   {facts['command']}\n" in (ROOT / "docs/kernels.md").read_text()  # the docs show this very command
    assert facts["total_bytes"] == facts["tree_bytes"] + facts["wheels_bytes"] <= 64 * 2**20
    installs = {d["name"].lower(): d["version"] for d in facts["installs"]}
    assert installs["mlflow-skinny"] == "3.17.2" and "submitit" in installs and "sqlalchemy" in installs
    table = subprocess.run([sys.executable, str(PREPARE), "--offline"], capture_output=True, text=True, timeout=300,
                           env=_clean_env())
    assert table.returncode == 0 and facts["command"] in table.stdout and "carried: .whl" in table.stdout


def test_prepare_refuses_an_incomplete_wheel_set_in_one_line(tmp_path):
    """A wheel missing from the closure is found here, not on the GPU machine."""
    checkout = fresh_checkout(tmp_path)
    (next((checkout / ".whl").glob("sqlalchemy-*.whl"))).unlink()
    subprocess.run(["git", "init", "-q", str(checkout)], check=True)  # prepare asks git what is ignored
    done = subprocess.run([sys.executable, str(checkout / "analysis/gpu/prepare.py"), "--offline"],
                          capture_output=True, text=True, timeout=300, env=_clean_env())
    assert done.returncode == 2, done.stdout
    assert done.stderr.startswith("error: ") and done.stderr.count("\n") == 1, done.stderr
    assert "sqlalchemy" in done.stderr.lower() and "Traceback" not in done.stderr


@pytest.mark.slow
def test_the_cpu_rehearsal_runs_every_stage_from_a_fresh_checkout(tmp_path):
    checkout = fresh_checkout(tmp_path)
    out = tmp_path / "out"
    done = kit(checkout, "--device", "cpu", "--out", str(out), "--budget", "1500")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert [s["name"] for s in summary["stages"]] == STAGES
    assert all(s["status"] == "passed" for s in summary["stages"]), summary["stages"]
    assert summary["ok"] and summary["rerun"] is None and not summary["files_over_limit"]
    files = sorted(p.name for p in out.iterdir())
    assert len(files) <= 8 and files == sorted(summary["files"]), files  # the device tool brings back 8

    env = json.loads((out / "env.json").read_text())
    assert Path(env["diffsweep_from"]) == checkout / "diffsweep"  # the copy ran, not the installed project
    assert Path(env["diffsweep_kernels_from"]).resolve() == (checkout / "kernels").resolve()
    assert env["pip_freeze"] and env["torch"]
    install = json.loads((out / "install.json").read_text())
    assert install["ok"] and any(d["name"].lower() == "mlflow-skinny" for d in install["would_install"])
    smoke = json.loads((out / "smoke.json").read_text())
    assert smoke["ok"] and set(smoke["errors"]) == {"out", "dq1", "dk1", "dq2", "dk2", "dv", "dlam"}

    suite = ET.parse(out / "tests.xml").getroot().find("testsuite")
    counts = {k: int(suite.get(k)) for k in ("tests", "failures", "errors", "skipped")}
    assert counts["tests"] >= GPU_SELECTION_FLOOR and counts["failures"] == counts["errors"] == 0, counts
    assert counts["tests"] - counts["skipped"] > 0  # the interpreter runs the kernel's tests here
    skipped = [c.find("skipped").get("message", "") for c in suite.iter("testcase") if c.find("skipped") is not None]
    assert all(skipped), "every skip says why"

    attention = json.loads((out / "attention.json").read_text())
    assert attention["complete"] and attention["cases"][0]["rows"]
    model = json.loads((out / "model.json").read_text())
    assert model["complete"] and [r["kind"] for r in model["rows"]] == ["transformer", "diff_v1", "diff_v2"]
    assert [r["kind"] for r in model["triton"]["rows"]] == ["transformer", "diff_v1"]
    train = json.loads((out / "train.json").read_text())
    assert train["ok"] and train["bitwise"] and train["resumed_steps"] and train["precision"] == "bf16 autocast"
    speed = train["speed"]  # the trainer's speed table, kept beside the train stage's facts
    assert speed["ok"] and [(r["kind"], r["mode"]) for r in speed["rows"]] == [
        (kind, mode) for mode in ("eager", "compiled") for kind in ("transformer", "diff_v1", "diff_v2")]
    assert all(r["tokens_per_s"] > 0 and "error" not in r for r in speed["rows"])
    compiled = [r for r in speed["rows"] if r["mode"] == "compiled"]
    assert all(r["recompiles"] == 0 and r["compile_s"] > 0 and r["compiled_vs_eager"] > 0 for r in compiled)
    for kind in ("transformer", "diff_v1", "diff_v2"):  # the same steps on the same batches, eager or compiled
        eager, comp = (next(r for r in speed["rows"] if (r["kind"], r["mode"]) == (kind, m)) for m in ("eager", "compiled"))
        assert comp["loss_last"] == pytest.approx(eager["loss_last"], abs=1e-2), kind  # bf16: within its rounding


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="a GPU machine: the kit runs there")
def test_without_cuda_and_without_device_cpu_it_stops_in_one_line(tmp_path):
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, str(ROOT / "analysis/gpu/run.py"), "--out", str(out)],
                          capture_output=True, text=True, timeout=120, env=_clean_env())
    assert done.returncode == 3, done.stderr
    assert done.stderr.count("\n") == 1 and "--device cpu" in done.stderr and "Traceback" not in done.stderr
    assert not out.exists()  # nothing written


@pytest.mark.parametrize(("args", "option"), [
    (["--stages", "env,bench"], "--stages"),
    (["--budget", "nan"], "--budget"),
    (["--budget", "-5"], "--budget"),
    (["--budget", "abc"], "--budget"),
    (["--device", "gpu"], "--device"),
])
def test_bad_options_are_one_line_exit_2(tmp_path, args, option):
    done = subprocess.run([sys.executable, str(ROOT / "analysis/gpu/run.py"), "--device", "cpu", "--out",
                           str(tmp_path / "out"), *args], capture_output=True, text=True, timeout=120,
                          env=_clean_env())
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"error: {option}:") and done.stderr.count("\n") == 1, done.stderr
    assert not (tmp_path / "out").exists()


def test_stages_that_do_not_fit_the_budget_are_listed_for_the_next_command(tmp_path):
    """A budget smaller than a stage's minimum starts nothing and says what to run next."""
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, str(ROOT / "analysis/gpu/run.py"), "--device", "cpu", "--out", str(out),
                           "--budget", "4", "--stages", "smoke,env"], capture_output=True, text=True, timeout=120,
                          env=_clean_env())
    assert done.returncode == 1, done.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert [(s["name"], s["status"]) for s in summary["stages"]] == [("env", "skipped"), ("smoke", "skipped")]
    assert "no time left" in summary["stages"][0]["reason"]
    assert summary["rerun"].endswith("--stages env,smoke") and summary["rerun"] in done.stdout


def test_a_stopped_kit_stops_its_stage_and_still_writes_the_summary(tmp_path):
    """The device tool ends a command at its time limit: the stage's whole process group goes,
    the summary says which stage was cut and what is left."""
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, str(ROOT / "analysis/gpu/run.py"), "--device", "cpu", "--out", str(out),
                             "--stages", "train,bench-model-triton"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=_clean_env())
    child = _stage_pid(proc.pid)
    deadline = time.monotonic() + 120
    while not (out / "train.json").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)  # wait for the state (the stage has begun writing), not for a time
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1, output
    summary = json.loads((out / "summary.json").read_text())
    statuses = [(s["name"], s["status"]) for s in summary["stages"]]
    # --stages adds what a stage needs: install before train.
    assert statuses == [("install", "passed"), ("train", "interrupted"), ("bench-model-triton", "skipped")], statuses
    assert summary["failed"] == ["train"] and summary["left"] == ["train", "bench-model-triton"]
    # A second command may land on a fresh machine: env again, and install, which train needs.
    assert summary["rerun"].endswith("--stages env,install,train,bench-model-triton")
    train = json.loads((out / "train.json").read_text())  # what the stage had, and why it stopped
    assert train["ok"] is False and train["error"].startswith("KeyboardInterrupt"), train
    if child is not None:
        deadline = time.monotonic() + 30
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _alive(child), "the stage's process was left running"


def _stage_pid(parent: int) -> int | None:
    """The stage subprocess the kit started (its child), once it exists."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        children = Path(f"/proc/{parent}/task/{parent}/children")
        if children.exists() and children.read_text().split():
            return int(children.read_text().split()[0])
        time.sleep(0.1)
    return None


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


def test_profile_step_times_every_phase_and_lists_the_top_kernels(capsys):
    """analysis/gpu/profile_step.py, the tool that found the unaligned FFN on the H100, runs here on
    the CPU at a tiny size: one line for the step, one per phase adding up to it, then the table."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("profile_step", ROOT / "analysis/gpu/profile_step.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(["diff_v1", "sdpa", "model.size=tiny-3xs", "train.seq_len=32", "train.micro_batch_size=2", "--table"])
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("diff_v1/sdpa tiny-3xs on CPU, FFN 48, 2 x 32 tokens"), out[0]
    phases = {line.split()[0]: float(line.split()[1]) for line in out[1:6]}
    assert list(phases) == ["forward", "loss", "backward", "clip", "optimizer"] and all(v > 0 for v in phases.values())
    assert float(out[0].split("step ")[1].removesuffix(" ms")) == pytest.approx(sum(phases.values()), abs=0.3)
    assert any("aten::mm" in line for line in out[6:]) and any("AdamW.step" in line for line in out[6:])
    assert out[-1].startswith("casts (aten::_to_copy calls) in the step: ")
    module.main(["transformer", "sdpa", "model.size=tiny-3xs", "model.n_layers=1", "train.seq_len=32",
                 "train.micro_batch_size=2", "--compile"])  # the blocks compiled as train.compile compiles them
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith(" ms") and ", compiled: step " in out[0], out[0]


def test_sdpa_check_runs_every_kernel_and_says_which_are_wrong(tmp_path):
    """analysis/gpu/sdpa_check.py (the flaky SDPA gradients of the GPU windows) on the CPU: every
    kernel x dtype x shape x V layout gets a row; the CPU has no cuDNN or efficient kernel."""
    out = tmp_path / "sdpa.json"
    done = subprocess.run([sys.executable, str(ROOT / "analysis/gpu/sdpa_check.py"), "--tiny", "--repeats", "1",
                           "--out", str(out)], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 4 * 2 * 5 * 2 and not any(r["WRONG"] for r in rows)
    ran = {r["kernel"] for r in rows if r["unsupported"] is None}
    assert {"default", "math", "flash"} <= ran and "cudnn" not in ran
    assert "0 wrong of 80" in done.stdout


def test_sdpa_variants_agree_and_are_timed(tmp_path):
    """analysis/gpu/sdpa_variants.py on the CPU: each way of running DIFF V1 / V2 through SDPA gives
    the first way's output and gradients (fp32), and every variant has both times."""
    out = tmp_path / "variants.json"
    done = subprocess.run([sys.executable, str(ROOT / "analysis/gpu/sdpa_variants.py"), "--tiny", "--reps", "1",
                           "--warmup", "1", "--out", str(out)], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    facts = json.loads(out.read_text())
    assert not facts["refused"]
    assert set(facts["max_err_vs_first"]) == {"four-calls", "stacked", "stacked-wide", "v2-gqa", "v2-repeat-kv",
                                              "v2-gqa4-gqa", "v2-gqa4-repeat-kv"}
    assert all(err < 1e-4 for err in facts["max_err_vs_first"].values()), facts["max_err_vs_first"]
    assert all(t["fwd"] > 0 and t["fwdbwd"] > 0 for t in facts["times_ms"].values())
