"""The device kit's own stages, each run by ``run.py`` in a subprocess: ``env``, ``install``,
``smoke``, ``train-speed`` and ``train``. (The GPU tests and the two benchmarks are the project's own commands.)

    python3 analysis/gpu/stages.py env     --device cuda --out OUT/env.json
    python3 analysis/gpu/stages.py install --device cuda --out OUT/install.json
    python3 analysis/gpu/stages.py smoke   --device cuda --out OUT/smoke.json
    python3 analysis/gpu/stages.py train-speed --device cuda --out SCRATCH/train-speed.json  (run.py: train.json's "speed")
    python3 analysis/gpu/stages.py train   --device cuda --out OUT/train.json

Each writes one JSON file with ``"ok"`` and exits 0 when the stage passed, 1 when it ran and
failed. ``--device cpu`` is the rehearsal: tiny shapes, Triton in its CPU interpreter.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
REQUIREMENTS = ROOT / "analysis/gpu/requirements.txt"
WHEELS = ROOT / ".whl"


def write(path: Path, facts: dict) -> None:
    """The stage's file, through the project's one atomic writer (a killed stage leaves the last
    complete version)."""
    from diffsweep.fsutil import write_atomically

    write_atomically(path, json.dumps(facts, indent=2, default=str) + "\n")


def _run(cmd: list[str], timeout: float = 60) -> tuple[int, str]:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return -1, f"{type(exc).__name__}: {exc}"
    return done.returncode, (done.stdout + done.stderr).strip()


# ---------------------------------------------------------------------------------------------- env
def env(device: str, facts: dict, save) -> None:
    """GPU, driver, versions and ``pip freeze``: what every figure of this run depends on."""
    import torch

    facts.update({"python": sys.version.split()[0], "executable": sys.executable, "platform": platform.platform(),
                  "cpus": os.cpu_count(), "torch": torch.__version__, "torch_cuda": torch.version.cuda,
                  "cuda_available": torch.cuda.is_available()})
    try:
        import triton

        facts["triton"] = triton.__version__
    except ImportError as exc:
        facts["triton"] = f"not importable: {exc}"
    import diffsweep
    import diffsweep_kernels

    facts["diffsweep_from"] = str(Path(diffsweep.__file__).parent)
    facts["diffsweep_kernels_from"] = str(Path(diffsweep_kernels.__file__).parent)
    if shutil.which("nvidia-smi"):
        _, facts["nvidia_smi"] = _run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                                       "--format=csv,noheader"])
    else:
        facts["nvidia_smi"] = None
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        facts["gpu"] = {"name": props.name, "capability": f"{props.major}.{props.minor}",
                        "memory_bytes": props.total_memory, "sms": props.multi_processor_count,
                        "cudnn": torch.backends.cudnn.version()}
    save()
    code, freeze = _run([sys.executable, "-m", "pip", "freeze", "--all"], timeout=30)
    facts["pip_freeze"] = freeze.splitlines() if code == 0 else [f"pip freeze failed: {freeze[-500:]}"]
    facts["ok"] = device != "cuda" or torch.cuda.is_available()
    if not facts["ok"]:
        facts["error"] = "torch sees no CUDA device"


# ------------------------------------------------------------------------------------------ install
def install(device: str, site: Path, facts: dict, save) -> None:
    """The wheels in ``.whl/`` into the GPU machine's Python, offline; pip takes only what the image
    lacks or has too old. If that environment cannot be written, into ``site`` (which ``run.py``
    puts on every stage's PYTHONPATH). On the CPU rehearsal nothing is installed (the project's
    environment has the packages already): the wheel set is resolved for the GPU machine's Python."""
    facts.update({"ok": False, "wheels": sorted(p.name for p in WHEELS.glob("*.whl"))})
    if not facts["wheels"]:
        facts["error"] = ".whl/ holds no wheels: run python3 analysis/gpu/prepare.py on the CPU machine and carry .whl"
        return
    base = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--no-index", "--find-links",
            str(WHEELS)]
    if device == "cuda":
        code, log = _run([*base, "-r", str(REQUIREMENTS)], timeout=50)
        facts["into"] = "the interpreter's environment"
        if code != 0:
            facts["first_try"] = log[-2000:]
            save()
            code, log = _run([*base, "--target", str(site), "-r", str(REQUIREMENTS)], timeout=50)
            facts["into"] = str(site)
        facts["log"] = log[-4000:]
        if code != 0:
            facts["error"] = "pip install failed (see log)"
            return
    else:
        sys.path.insert(0, str(ROOT / "analysis/gpu"))
        from prepare import KitError, resolve

        try:
            facts["would_install"] = resolve(WHEELS)
        except KitError as exc:
            facts["error"] = str(exc)
            return
        facts["into"] = "nothing (CPU rehearsal: resolved for the GPU machine's Python, offline)"
    check = ("import importlib.metadata as m, mlflow, submitit, sqlalchemy, alembic; "
             "print({n: m.version(n) for n in ('mlflow-skinny', 'submitit', 'sqlalchemy', 'alembic')})")
    env_vars = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, env=env_vars)
    facts["imports"] = (done.stdout or done.stderr).strip()[-2000:]
    facts["ok"] = done.returncode == 0
    if not facts["ok"]:
        facts["error"] = "mlflow/submitit do not import after the install"


# -------------------------------------------------------------------------------------------- smoke
def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def smoke(device: str, facts: dict, save) -> None:
    """The fused kernel against the fp64 reference at DIFF V1's 1.4B head shape (bf16, 8 heads of
    Q/K 128 and V 256, T = 2048), every output and gradient, with full autotuning (which also
    fills Triton's compile cache for the benchmarks); its first-call and steady times. The CPU
    rehearsal runs a tiny shape in fp32 in Triton's interpreter. The tolerance is the tests' own
    (``diffsweep_kernels.reference.compare``)."""
    import torch

    from diffsweep_kernels import reference, triton_configs, triton_diff

    if device == "cuda":
        dtype, (B, H, Hkv, T, D, Dv) = torch.bfloat16, (1, 8, 8, 2048, 128, 256)
    else:
        dtype, (B, H, Hkv, T, D, Dv) = torch.float32, (1, 2, 2, 64, 16, 32)
    g = torch.Generator().manual_seed(0)
    tensors = [torch.randn(B, H, T, D, generator=g) * 2, torch.randn(B, Hkv, T, D, generator=g) * 2,
               torch.randn(B, H, T, D, generator=g) * 2, torch.randn(B, Hkv, T, D, generator=g) * 2,
               torch.randn(B, Hkv, T, Dv, generator=g), torch.tensor(0.6)]
    scale = D**-0.5

    def kernel(q1, k1, q2, k2, v, lam):
        return triton_diff.diff_attention(q1, k1, q2, k2, v, lam, scale=scale)

    def ref(q1, k1, q2, k2, v, lam):
        return reference.diff_attention(q1, k1, q2, k2, v, lam, scale=scale, upcast=True)

    facts.update({"ok": False, "shape": {"B": B, "H": H, "Hkv": Hkv, "T": T, "D": D, "Dv": Dv}, "dtype": str(dtype),
                  "autotune_mode": triton_configs.autotune_mode()})
    # First call: autotuning and compiling every config of the forward, then of both backward kernels.
    leaves = [t.detach().to(device, dtype if t.dim() else torch.float32).requires_grad_() for t in tensors]
    start = time.perf_counter()
    out = kernel(*leaves)
    _sync(device)
    facts["first_forward_s"] = time.perf_counter() - start
    save()
    start = time.perf_counter()
    out.backward(torch.ones_like(out))
    _sync(device)
    facts["first_backward_s"] = time.perf_counter() - start
    facts["autotune"] = triton_diff.chosen_configs()
    save()

    truth = reference.outputs_and_grads(ref, tensors, torch.float64, device)
    ref_low = reference.outputs_and_grads(ref, tensors, dtype, device)
    got = reference.outputs_and_grads(kernel, tensors, dtype, device)
    facts["errors"] = reference.compare(truth, ref_low, got, dtype)
    facts["ok"] = all(check["ok"] for check in facts["errors"].values())
    save()

    if device == "cuda":  # steady-state times (the benchmarks measure them properly, side by side)
        fwd, fwd_bwd = [], []
        for _ in range(12):
            start = time.perf_counter()
            out = kernel(*leaves)
            _sync(device)
            fwd.append(time.perf_counter() - start)
            start = time.perf_counter()
            kernel(*leaves).backward(torch.ones_like(out))
            _sync(device)
            fwd_bwd.append(time.perf_counter() - start)
        facts["fwd_ms"] = statistics.median(fwd[2:]) * 1e3
        facts["fwd_bwd_ms"] = statistics.median(fwd_bwd[2:]) * 1e3
        facts["peak_alloc_bytes"] = torch.cuda.max_memory_allocated()


# -------------------------------------------------------------------------------------------- train
TRAIN = {  # a short real run: the fused kernel (GPU) under bf16 autocast, checkpointed and resumed
    "cuda": {"size": "tiny-l", "backend": "triton", "seq": 256, "batch_tokens": 8192, "micro": 16, "steps": 200,
             "every": 50, "resume": 100},
    "cpu": {"size": "tiny-3xs", "backend": "sdpa", "seq": 32, "batch_tokens": 128, "micro": 2, "steps": 12,
            "every": 3, "resume": 6},
}


def _text_dataset(root: Path) -> Path:
    """Real English text that ships with Python (the pydoc topics, ~0.5 MB), tokenized with a
    512-token BPE (the GPU machine has no network and no demo corpus)."""
    import pydoc_data.topics

    from diffsweep.config import TokenizerKind
    from diffsweep.data.prepare import Document, prepare

    source = root / "topics.txt"
    topics = sorted(pydoc_data.topics.topics.items())
    source.write_text("\n".join(text for _, text in topics), encoding="utf-8")
    docs = [Document(name, text, source) for name, text in topics]
    prepare(docs, root / "dataset", TokenizerKind.BPE, vocab_size=512)
    return root / "dataset"


def train(device: str, facts: dict, save) -> None:
    """bf16 autocast training of DIFF V1: an uninterrupted run against one resumed from its
    middle checkpoint, step by step. The step after the resume starts from the restored weights
    and data position, so its loss must equal the uninterrupted run's exactly, on a GPU too; later steps may drift there (atomic adds in the embedding backward reorder sums), so their
    largest difference is reported, not required to be 0. On the CPU every step must be equal.
    On a GPU the checkpoint must hold the CUDA RNG state."""
    import torch

    from diffsweep.config import load_config
    from diffsweep.train.checkpoint import checkpoint_path, load_checkpoint
    from diffsweep.train.trainer import train as run_training

    p = TRAIN[device]
    facts.update({"ok": False, "kind": "diff_v1", "backend": p["backend"], "size": p["size"],
                  "precision": "bf16 autocast", "steps": p["steps"], "resume_from_step": p["resume"],
                  "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu"})
    save()
    work = Path(tempfile.mkdtemp(prefix="diffsweep-kit-train-"))
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{work / 'mlflow.db'}"
    dataset = _text_dataset(work)
    cfg = load_config(None, [
        f"model.size={p['size']}", "model.vocab_size=512", "model.attention.kind=diff_v1",
        f"model.attention.backend={p['backend']}", f"data.path={dataset}", "train.precision=bf16",
        f"train.seq_len={p['seq']}", f"train.batch_tokens={p['batch_tokens']}", f"train.micro_batch_size={p['micro']}",
        f"train.max_steps={p['steps']}", "train.warmup_steps=10", f"train.eval_every={p['every']}",
        "train.eval_tokens=2048", f"train.checkpoint_every={p['every']}", "train.keep_checkpoints=100",
        "train.log_every=1"])
    full: dict[int, dict] = {}
    resumed: dict[int, dict] = {}

    def recorder(into):
        return lambda step, metrics: into.__setitem__(step, {k: float(v) for k, v in metrics.items()
                                                              if not k.endswith("tokens_per_s") and k != "train/mfu"})

    start = time.perf_counter()
    first = run_training(cfg, work / "full", experiment="kit", callbacks=(recorder(full),), echo=lambda s: None)
    facts.update({"status": first.status, "seconds_with_eval_and_checkpoints": time.perf_counter() - start,
                  "loss_first": full[1]["train/loss"], "loss_last": full[p["steps"]]["train/loss"]})
    save()
    checkpoint = checkpoint_path(work / "full" / "checkpoints", p["resume"])
    facts["cuda_rng_saved"] = bool(load_checkpoint(checkpoint)["rng"]["cuda"])
    run_training(cfg, work / "resumed", experiment="kit", resume_from=checkpoint, callbacks=(recorder(resumed),),
                 echo=lambda s: None)
    later = [s for s in sorted(full) if s > p["resume"]]
    diffs = [abs(full[s]["train/loss"] - resumed[s]["train/loss"]) for s in later if s in resumed]
    after = p["resume"] + 1
    facts.update({
        "resumed_steps": sorted(resumed) == later,
        # Its loss (forward only: the same weights and batch); its gradient norm already went
        # through the backward's atomics.
        "first_step_after_resume_equal": after in resumed and full[after]["train/loss"] == resumed[after]["train/loss"],
        "bitwise": sorted(resumed) == later and all(full[s] == resumed[s] for s in later),
        "max_abs_loss_diff": max(diffs) if diffs else None,
    })
    learns = facts["loss_last"] < facts["loss_first"]
    exact = facts["first_step_after_resume_equal"] if device == "cuda" else facts["bitwise"]
    facts["required"] = ("the loss of the step after the resume equal, the CUDA RNG state saved" if device == "cuda"
                         else "every step after the resume equal")
    facts["ok"] = (first.status == "finished" and facts["resumed_steps"] and exact and learns
                   and (facts["cuda_rng_saved"] or device != "cuda"))
    shutil.rmtree(work, ignore_errors=True)


# -------------------------------------------------------------------------------------- train-speed
SPEED = {  # diffsweep's trainer itself, each kind eager and compiled: the training-speed table (issue #50)
    "cuda": {"size": "1.4B", "vocab": None, "seq": 2048, "micro": 4, "steps": 12},
    "cpu": {"size": "tiny-3xs", "vocab": 512, "seq": 32, "micro": 2, "steps": 4},
}
SPEED_KINDS = ("transformer", "diff_v1", "diff_v2")
TIMED_FROM = 3  # steps before it compile (the first), or settle (the second): not timed


class _RowDone(Exception):
    """Raised by the row's callback after its last timed step: no evaluation, no checkpoint."""


def train_speed(device: str, facts: dict, save) -> None:
    """Each kind trained eagerly and then compiled (``train.compile``) through the trainer that
    ``diffsweep train`` runs, bf16 autocast, the sdpa backend, one micro-batch per step, a row
    written as each finishes: tokens/s and MFU (medians from step ``TIMED_FROM``), compile seconds,
    recompiles, and on a GPU the peak allocated memory against the planner's estimate of it
    (``estimate_memory`` less its fixed overhead) and the memory in use outside the allocator."""
    import gc

    import torch

    from diffsweep.config import load_config
    from diffsweep.model.memory import estimate_memory
    from diffsweep.train.trainer import train as run_training

    p = SPEED[device]
    gpu = device == "cuda"
    facts.update({"ok": False, "size": p["size"], "seq_len": p["seq"], "micro_batch": p["micro"],
                  "timed_steps": p["steps"] - TIMED_FROM + 1, "precision": "bf16 autocast", "backend": "sdpa",
                  "device": torch.cuda.get_device_name(0) if gpu else "cpu", "rows": []})
    save()
    work = Path(tempfile.mkdtemp(prefix="diffsweep-kit-speed-"))
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{work / 'mlflow.db'}"
    dataset = _text_dataset(work)
    print(f"{'kind':12} {'mode':9} {'tokens/s':>10} {'MFU':>6} {'compile s':>9} {'recompiles':>10} "
          f"{'peak GiB':>8} {'planner':>8} {'ratio':>6}", flush=True)
    for mode in ("eager", "compiled"):
        for kind in SPEED_KINDS:
            cfg = load_config(None, [
                f"model.size={p['size']}", *([f"model.vocab_size={p['vocab']}"] if p["vocab"] else []),
                f"model.attention.kind={kind}", "model.attention.backend=sdpa", f"data.path={dataset}",
                "train.precision=bf16", f"train.compile={'true' if mode == 'compiled' else 'false'}",
                f"train.seq_len={p['seq']}", f"train.batch_tokens={p['seq'] * p['micro']}",
                f"train.micro_batch_size={p['micro']}", f"train.max_steps={p['steps'] + 1}", "train.warmup_steps=2",
                "train.eval_every=1000000", "train.checkpoint_every=1000000", "train.log_every=1000000"])
            steps: dict[int, dict[str, float]] = {}

            def record(step: int, metrics: dict[str, float], steps=steps) -> None:
                steps[step] = dict(metrics)
                if step == p["steps"]:
                    raise _RowDone

            if gpu:
                torch.cuda.reset_peak_memory_stats()
            row: dict = {"kind": kind, "mode": mode}
            started = time.perf_counter()
            try:
                run_training(cfg, work / f"{kind}-{mode}", experiment="kit-speed", callbacks=(record,),
                             echo=lambda line: None)
            except _RowDone:
                pass
            except Exception as exc:  # noqa: BLE001 (out of memory, a compile error: this row fails, the next runs)
                row["error"] = f"{type(exc).__name__}: {exc}"[:2000]
            row["seconds"] = time.perf_counter() - started
            timed = [steps[s] for s in sorted(steps) if s >= TIMED_FROM]
            if timed:
                row["tokens_per_s"] = statistics.median(m["train/tokens_per_s"] for m in timed)
                row["mfu"] = statistics.median(m["train/mfu"] for m in timed) if "train/mfu" in timed[0] else None
                row["loss_last"] = timed[-1]["train/loss"]
            if mode == "compiled" and steps:
                row["compile_s"] = steps.get(2, {}).get("train/compile_s")
                row["recompiles"] = max(m["train/recompiles"] for m in steps.values())
            if gpu:
                free, total = torch.cuda.mem_get_info()
                estimate = estimate_memory(cfg, world_size=1, gpu_memory_bytes=total)
                row.update({"peak_alloc_bytes": torch.cuda.max_memory_allocated(),
                            "planner_in_allocator_bytes": estimate.total - estimate.overhead,
                            "planner_overhead_bytes": estimate.overhead,
                            "outside_allocator_bytes": total - free - torch.cuda.memory_reserved()})
                row["peak_over_planner"] = row["peak_alloc_bytes"] / row["planner_in_allocator_bytes"]
            base = next((r for r in facts["rows"] if r["kind"] == "transformer" and r["mode"] == mode), None)
            if base and base.get("tokens_per_s") and row.get("tokens_per_s"):
                row["ratio_vs_transformer"] = row["tokens_per_s"] / base["tokens_per_s"]
            eager = next((r for r in facts["rows"] if r["kind"] == kind and r["mode"] == "eager"), None)
            if mode == "compiled" and eager and eager.get("tokens_per_s") and row.get("tokens_per_s"):
                row["compiled_vs_eager"] = row["tokens_per_s"] / eager["tokens_per_s"]
            facts["rows"].append(row)
            save()
            print(_speed_line(row), flush=True)
            gc.collect()
            if gpu:
                torch.cuda.empty_cache()
    rows = facts["rows"]
    facts["ok"] = (len(rows) == 2 * len(SPEED_KINDS) and not any("error" in r for r in rows)
                   and all(r.get("recompiles") == 0 for r in rows if r["mode"] == "compiled")
                   and all(r.get("tokens_per_s") for r in rows))
    shutil.rmtree(work, ignore_errors=True)


def _speed_line(row: dict) -> str:
    def number(key: str, fmt: str, scale: float = 1.0) -> str:
        value = row.get(key)
        return "—" if value is None else format(value * scale, fmt)

    line = (f"{row['kind']:12} {row['mode']:9} {number('tokens_per_s', ',.0f'):>10} {number('mfu', '.1%'):>6} "
            f"{number('compile_s', '.1f'):>9} {number('recompiles', '.0f'):>10} "
            f"{number('peak_alloc_bytes', '.1f', 2**-30):>8} {number('planner_in_allocator_bytes', '.1f', 2**-30):>8} "
            f"{number('ratio_vs_transformer', '.3f'):>6}")
    return line + (f"  error: {row['error'][:200]}" if "error" in row else "")


STAGE_FUNCTIONS = {"env": env, "smoke": smoke, "train": train, "train-speed": train_speed}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("stage", choices=("env", "install", "smoke", "train-speed", "train"))
    parser.add_argument("--device", choices=("cuda", "cpu"), required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--site", type=Path, default=Path(tempfile.gettempdir()) / "diffsweep-kit-site")
    args = parser.parse_args(argv)
    facts: dict = {"ok": False}

    def save() -> None:
        write(args.out, facts)

    # A crash, or the SIGINT run.py sends at the stage's limit, still leaves what was measured
    # and why it stopped.
    try:
        if args.stage == "install":
            install(args.device, args.site, facts, save)
        else:
            STAGE_FUNCTIONS[args.stage](args.device, facts, save)
    except BaseException as exc:  # noqa: BLE001 (recorded, then re-raised)
        facts["ok"] = False
        facts["error"] = f"{type(exc).__name__}: {exc}"[:4000]
        facts["traceback"] = traceback.format_exc()[-8000:]
        save()
        raise
    save()
    print(json.dumps({k: v for k, v in facts.items() if k not in ("pip_freeze", "log", "wheels", "would_install")},
                     default=str))
    return 0 if facts.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
