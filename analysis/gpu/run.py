"""The device kit: everything a rare GPU window should check, as one command with a time budget.

On the GPU machine (prepared by ``analysis/gpu/prepare.py``, which prints the exact call)::

    PYTHONUNBUFFERED=1 python3 analysis/gpu/run.py --out "$OUT" --budget 450

Stages, in order, each in its own subprocess (own process group) with its own time cap, cut to
what is left of ``--budget``; a stage that cannot get its minimum is not started, and the
summary prints the command that runs what is left. Files written to ``--out`` (at most 8, of at
most 16 MiB each: what comes back from the machine):

- ``env.json``       GPU, driver, torch/Triton versions, ``pip freeze``  (stage ``env``)
- ``install.json``   the carried wheels installed offline                 (stage ``install``)
- ``smoke.json``     fused kernel vs fp64 reference at the 1.4B head      (stage ``smoke``)
- ``train.json``     ``"speed"``: the trainer's tokens/s, MFU, compile s and peak memory, each kind
                     eager and compiled at 1.4B                           (stage ``train-speed``)
- ``tests.xml``      ``pytest -m gpu`` as JUnit XML, skip reasons in it   (stage ``tests``)
- ``attention.json`` ``diffsweep bench attention``, written row by row    (stage ``bench-attention``)
- ``model.json``     ``diffsweep bench model`` (sdpa, then triton rows)   (stages ``bench-model``, ``bench-model-triton``)
- ``train.json``     bf16 training, checkpoint, resume vs uninterrupted   (stage ``train``; ``"speed"`` kept)
- ``summary.json``   every stage: status, seconds, exit code, output tail (rewritten after each stage)

``--device cpu`` rehearses the same stages on a CPU machine (tiny shapes, Triton's interpreter):
CI runs it, so the only unknown left on the GPU machine is the GPU. Without CUDA and without
``--device cpu`` it stops at once: one line, exit 3. Exit 0 when every stage passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

ROOT = Path(__file__).resolve().parents[2]
KIT = ROOT / "analysis/gpu"
MAX_FILES, MAX_FILE_BYTES = 8, 16 * 2**20  # what comes back from the machine's $OUT
TAIL_LINES = 40
# A stage at its limit first gets SIGINT (pytest then writes its JUnit XML of the tests run so
# far; the benchmarks and stages.py write what they measured), this many seconds before the kill.
GRACE_S = 15.0
RERUN_BUDGET_S = 240  # a second command: what is left of a 15-minute window after a first of ~8


@dataclass(frozen=True)
class Stage:
    """One step of the kit: its command, its time cap and the least time worth starting it with
    (GPU, CPU rehearsal), the stages it needs (a rerun includes them: a fresh machine has lost
    what they installed), and the file it writes."""

    name: str
    cap_s: tuple[float, float]
    min_s: tuple[float, float]
    output: str
    needs: tuple[str, ...] = ()


STAGES = (
    Stage("env", (40, 60), (5, 5), "env.json"),
    Stage("install", (90, 60), (15, 10), "install.json"),
    Stage("smoke", (150, 120), (40, 20), "smoke.json"),
    Stage("train-speed", (240, 180), (60, 30), "train.json"),
    Stage("tests", (180, 600), (60, 60), "tests.xml"),
    Stage("bench-attention", (150, 180), (45, 30), "attention.json"),
    Stage("bench-model", (120, 180), (45, 30), "model.json"),
    Stage("train", (120, 180), (40, 30), "train.json", needs=("install",)),
    Stage("bench-model-triton", (90, 180), (40, 30), "model.json"),
)
BY_NAME = {s.name: s for s in STAGES}
# Triton autotuning per stage (kernels/triton_diff.py): every config where speed is measured (the
# smoke stage's compiles fill Triton's cache for the benchmarks), one config per kernel where only
# correctness is (the tests set that themselves and check every config in one test; training).
# The 1.4B model benchmarks fill ~66 of ~78 GiB on an H100: expandable segments keep the caching
# allocator's fragmentation from ending a row early (peak allocated memory is not affected).
STAGE_ENV = {
    "smoke": {"DIFFSWEEP_TRITON_AUTOTUNE": "all"},
    "bench-attention": {"DIFFSWEEP_TRITON_AUTOTUNE": "all"},
    "bench-model": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
    "bench-model-triton": {"DIFFSWEEP_TRITON_AUTOTUNE": "all", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
    "train": {"DIFFSWEEP_TRITON_AUTOTUNE": "first"},
    "train-speed": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
}
# Stages whose file another stage also writes: each writes to the scratch folder, and after every
# stage its file is put into the shared one under a key (the shared file is rewritten by its stage).
EXTRAS = {"bench-model-triton": ("model.json", "model-triton.json", "triton"),
          "train-speed": ("train.json", "train-speed.json", "speed")}

# The CPU rehearsal's benchmark settings: the smallest shapes, one repetition.
CPU_ATTENTION = ["--layout", "tiny-2xs", "--seq", "16", "--batch-tokens", "32", "--reps", "1", "--warmup", "0"]
CPU_MODEL = ["--size", "tiny-3xs", "--seq", "16", "--micro-batch", "1", "--steps", "1", "--warmup", "0"]


@dataclass
class Result:
    name: str
    status: str  # passed, failed, timeout, skipped, interrupted
    seconds: float = 0.0
    returncode: int | None = None
    reason: str = ""
    tail: list[str] = field(default_factory=list)


def command(stage: Stage, device: str, out: Path, scratch: Path) -> list[str]:
    """The subprocess a stage runs (from the repository root); ``scratch`` holds the fallback
    install target (on every stage's PYTHONPATH) and files that must not land in ``out``."""
    py, target = sys.executable, str(out / stage.output)
    if stage.name in EXTRAS:
        target = str(scratch / EXTRAS[stage.name][1])
    if stage.name in ("env", "install", "smoke", "train-speed", "train"):
        return [py, str(KIT / "stages.py"), stage.name, "--device", device, "--out", target,
                "--site", str(scratch / "site")]
    if stage.name == "tests":
        workers = ["-n", "8"] if device == "cuda" else []
        return [py, "-m", "pytest", "-m", "gpu", "-p", "no:cacheprovider", "-q", "-rs", "--junitxml", target,
                "-o", "junit_logging=no", "--continue-on-collection-errors", *workers]
    if stage.name == "bench-attention":
        return [py, "-m", "diffsweep", "bench", "attention", "--device", device, "--out", target,
                *(CPU_ATTENTION if device == "cpu" else [])]
    base = [py, "-m", "diffsweep", "bench", "model", "--device", device,
            *(CPU_MODEL if device == "cpu" else ["--size", "1.4B", "--seq", "2048", "--micro-batch", "4"])]
    if stage.name == "bench-model":
        return [*base, "--out", target]
    # The fused kernel in a whole model; the Transformer beside it for the ratio. Appends its rows to
    # a second file and merges (model.json keeps the sdpa rows if this one is cut short).
    return [*base, "--backend", "triton", "--kind", "transformer", "--kind", "diff_v1", "--out", target]


def stage_env(device: str, site: Path, kernels_link: Path) -> dict[str, str]:
    """The environment every stage runs in: the checkout and ``diffsweep_kernels`` importable
    without installing the project (no network there for its build dependencies)."""
    path = [str(ROOT), str(kernels_link.parent), str(site), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p), "PYTHONUNBUFFERED": "1",
           "MLFLOW_DISABLE_TELEMETRY": "true"}
    if device == "cuda":
        env["DIFFSWEEP_REQUIRE_GPU"] = "1"  # a GPU test that skips for want of CUDA fails here
        env.pop("TRITON_INTERPRET", None)
    else:
        env["TRITON_INTERPRET"] = "1"
        env.setdefault("OMP_NUM_THREADS", "1")
    return env


def link_kernels(scratch: Path) -> Path:
    """``scratch/diffsweep_kernels -> kernels/``: the import name an install would give it."""
    link = scratch / "diffsweep_kernels"
    if not link.exists():
        link.symlink_to(ROOT / "kernels", target_is_directory=True)
    return link


class Runner:
    """Runs stages one after another within the budget; a SIGTERM/SIGINT stops the stage running
    (its whole process group) and still writes the summary."""

    def __init__(self, device: str, out: Path, budget: float, env: dict[str, str], scratch: Path) -> None:
        self.device, self.out, self.budget, self.env, self.scratch = device, out, budget, env, scratch
        self.start = time.monotonic()
        self.results: list[Result] = []
        self.proc: subprocess.Popen | None = None
        self.stopping = False

    def left(self) -> float:
        return self.budget - (time.monotonic() - self.start)

    def stop(self, signum, frame) -> None:
        self.stopping = True
        if self.proc is not None and self.proc.poll() is None:
            _stop(self.proc, grace=5.0)

    def run(self, stages: list[Stage]) -> None:
        gpu = 0 if self.device == "cuda" else 1
        for stage in stages:
            failed_need = next((n for n in stage.needs if self._status(n) not in (None, "passed")), None)
            if self.stopping:
                result = Result(stage.name, "skipped", reason="interrupted before it started")
            elif failed_need:
                result = Result(stage.name, "skipped", reason=f"needs stage {failed_need}, which did not pass")
            elif self.left() < stage.min_s[gpu]:
                result = Result(stage.name, "skipped", reason=f"no time left ({max(0, self.left()):.0f} s of the "
                                f"budget, needs {stage.min_s[gpu]:.0f} s)")
            else:
                result = self._run_one(stage, min(stage.cap_s[gpu], self.left()))
            self.results.append(result)
            print(f"== {stage.name}: {result.status} in {result.seconds:.1f} s{': ' + result.reason if result.reason else ''}",
                  flush=True)
            self.write_summary()

    def _status(self, name: str) -> str | None:
        return next((r.status for r in self.results if r.name == name), None)

    def _run_one(self, stage: Stage, timeout: float) -> Result:
        cmd = command(stage, self.device, self.out, self.scratch)
        print(f"== {stage.name} (at most {timeout:.0f} s): {shlex.join(cmd)}", flush=True)
        tail: deque[str] = deque(maxlen=TAIL_LINES)
        start = time.monotonic()
        self.proc = proc = subprocess.Popen(cmd, cwd=ROOT, env={**self.env, **STAGE_ENV.get(stage.name, {})},
                                            stdout=subprocess.PIPE,
                                            stderr=subprocess.STDOUT, text=True, errors="replace",
                                            process_group=0)
        if self.stopping:  # a signal that came while the stage was being started
            _stop(proc, grace=5.0)
        reader = threading.Thread(target=_pump, args=(proc, tail, stage.name), daemon=True)
        reader.start()
        try:
            proc.wait(timeout=max(1.0, timeout - GRACE_S))
            timed_out = False
        except subprocess.TimeoutExpired:
            _stop(proc, grace=GRACE_S)
            timed_out = True
        reader.join(timeout=10)
        self.proc = None
        seconds = time.monotonic() - start
        for shared, extra, key in EXTRAS.values():
            _merge(self.out / shared, self.scratch / extra, key)
        if timed_out:
            return Result(stage.name, "timeout", seconds, None, f"stopped at its {timeout:.0f} s limit", list(tail))
        if self.stopping:
            return Result(stage.name, "interrupted", seconds, proc.returncode, "the kit was stopped", list(tail))
        if proc.returncode == 0:
            return Result(stage.name, "passed", seconds, 0, "", list(tail))
        return Result(stage.name, "failed", seconds, proc.returncode, f"exit code {proc.returncode}", list(tail))

    def write_summary(self) -> dict:
        for tmp in self.out.glob(".*.tmp"):  # a writer's temporary file left by a killed stage
            tmp.unlink(missing_ok=True)
        files = sorted(p for p in self.out.iterdir() if p.is_file())
        failed = [r.name for r in self.results if r.status in ("failed", "timeout", "interrupted")]
        left = [r.name for r in self.results if r.status in ("skipped", "timeout", "interrupted")]
        summary = {
            "device": self.device, "budget_s": self.budget, "elapsed_s": round(time.monotonic() - self.start, 1),
            "ok": bool(self.results) and all(r.status == "passed" for r in self.results),
            "failed": failed, "left": left,
            "stages": [r.__dict__ for r in self.results],
            "files": [p.name for p in files] + ([] if "summary.json" in {p.name for p in files} else ["summary.json"]),
            "files_over_limit": [p.name for p in files if p.stat().st_size > MAX_FILE_BYTES],
            "rerun": rerun_command(left) if left else None,
        }
        tmp = self.out / ".summary.json.tmp"
        tmp.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
        os.replace(tmp, self.out / "summary.json")
        return summary


def rerun_command(left: list[str]) -> str:
    """The second command: the stages left, with ``env`` (the figures need the machine they came
    from) and what they need (a fresh machine has lost the first command's installs), in order."""
    wanted = {"env", *left, *(need for name in left for need in BY_NAME[name].needs)}
    names = [s.name for s in STAGES if s.name in wanted]
    return (f"PYTHONUNBUFFERED=1 python3 analysis/gpu/run.py --out \"$OUT\" --budget {RERUN_BUDGET_S} "
            f"--stages {','.join(names)}")


def _pump(proc: subprocess.Popen, tail: deque, name: str) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        line = line.rstrip("\n")
        tail.append(line[-400:])
        print(f"[{name}] {line}", flush=True)


def _stop(proc: subprocess.Popen, grace: float) -> None:
    """SIGINT to the stage's leader (it writes what it has), then TERM and KILL to its whole
    process group (pytest-xdist workers, Triton's compile workers)."""
    steps = ((lambda: os.kill(proc.pid, signal.SIGINT), grace),
             (lambda: os.killpg(proc.pid, signal.SIGTERM), 5.0),
             (lambda: os.killpg(proc.pid, signal.SIGKILL), 5.0))
    for send, wait in steps:
        try:
            send()
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
        try:  # the leader is gone; its group may not be
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return


def _merge(shared: Path, extra: Path, key: str) -> None:
    """``shared`` gets ``extra``'s facts under ``key`` beside its own stage's (or alone, before it ran)."""
    if not extra.exists():
        return
    try:
        facts = json.loads(extra.read_text(encoding="utf-8"))
        base = json.loads(shared.read_text(encoding="utf-8")) if shared.exists() else {}
    except json.JSONDecodeError:
        return
    base[key] = facts
    tmp = shared.with_name(f".{shared.name}.tmp")
    tmp.write_text(json.dumps(base, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, shared)


def _print_table(summary: dict) -> None:
    print(f"\n{'stage':<20} {'status':<12} {'seconds':>8}  reason")
    for r in summary["stages"]:
        print(f"{r['name']:<20} {r['status']:<12} {r['seconds']:>8.1f}  {r['reason']}")
    print(f"{'total':<20} {'ok' if summary['ok'] else 'NOT OK':<12} {summary['elapsed_s']:>8.1f}  "
          f"of a {summary['budget_s']:.0f} s budget; files: {', '.join(summary['files'])}")
    if summary["files_over_limit"]:
        print(f"over 16 MiB, too large to bring back: {', '.join(summary['files_over_limit'])}")
    if summary["failed"]:
        print(f"failed or cut short: {', '.join(summary['failed'])} (summary.json has each one's output tail)")
    if summary["rerun"]:
        print(f"what is left, as a second command (fresh machine: install again): {summary['rerun']}")


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is the project's one line (exit 2), not a usage block."""

    def error(self, message: str) -> NoReturn:
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)


def _options(argv: list[str] | None) -> tuple[Path, str, float, list[Stage]]:
    """The checked options; a bad one is one line naming it, exit 2, before anything is written."""
    parser = _Parser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--out", default=os.environ.get("OUT"), help="output folder (default: $OUT)")
    parser.add_argument("--device", default="cuda", help="cuda (default; refused without a GPU) or cpu: the rehearsal")
    parser.add_argument("--budget", default="450", help="seconds for all stages (default 450)")
    parser.add_argument("--stages", default=None, help=f"comma-separated subset of {', '.join(BY_NAME)} (with "
                        "the stages they need)")
    args = parser.parse_args(argv)
    if not args.out:
        parser.error("--out: expected an output folder (or $OUT), got none")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        parser.error(f"--out: expected a folder, got the file '{args.out}'")
    if args.device not in ("cuda", "cpu"):
        parser.error(f"--device: expected one of [cuda, cpu], got '{args.device}'")
    try:
        budget = float(args.budget)
    except ValueError:
        budget = float("nan")
    if not 0 < budget < float("inf"):
        parser.error(f"--budget: expected a positive number of seconds, got '{args.budget}'")
    if args.stages is None:
        return out, args.device, budget, list(STAGES)
    names = [n.strip() for n in args.stages.split(",") if n.strip()]
    if not names or any(n not in BY_NAME for n in names):
        parser.error(f"--stages: expected names from [{', '.join(BY_NAME)}], got '{args.stages}'")
    wanted = {*names, *(need for name in names for need in BY_NAME[name].needs)}  # install for train
    return out, args.device, budget, [s for s in STAGES if s.name in wanted]  # always in the kit's order


def main(argv: list[str] | None = None) -> int:
    out, device, budget, stages = _options(argv)
    if device == "cuda" and not _cuda_visible():
        print("error: no CUDA GPU is visible; run on the GPU machine, or rehearse here with --device cpu",
              file=sys.stderr)
        return 3
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="diffsweep-kit-"))
    env = stage_env(device, scratch / "site", link_kernels(scratch))
    runner = Runner(device, out, budget, env, scratch)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, runner.stop)
    runner.run(stages)
    summary = runner.write_summary()
    _print_table(summary)
    return 0 if summary["ok"] else 1


def _cuda_visible() -> bool:
    """Without importing torch (seconds): the driver's tool lists a GPU."""
    try:
        done = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0 and "GPU" in done.stdout


if __name__ == "__main__":
    sys.exit(main())
