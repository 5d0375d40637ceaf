"""MLflow logging overhead per training step, as a fraction of step time (target ≤ 1%).

Trains a tiny model with the real trainer twice in one process, side by side: once logging to a
fresh SQLite MLflow store, once with tracking off (``NullTracker``). Reports

- the time spent inside the tracker (buffering every step's metrics, batched ``log_batch``
  flushes, checkpoint-time flushes), measured around each call, as a fraction of the loop time;
- the wall time per step of both runs and their ratio (noisier: other load on the machine shows).

    python analysis/benchmarks/bench_tracking.py [--data DIR] [--size tiny-m] [--steps 200]

``--data`` defaults to a dataset made from CPython's pydoc topics (bytes tokenizer).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

from diffsweep.config import TokenizerKind, load_config  # noqa: E402
from diffsweep.tracking.logger import MlflowTracker, NullTracker  # noqa: E402
from diffsweep.train import trainer  # noqa: E402


class TimedTracker(MlflowTracker):
    """The real tracker, with the time spent in ``log`` and ``flush`` added up."""

    seconds = 0.0
    calls = 0

    def log(self, step, metrics):
        started = time.perf_counter()
        super().log(step, metrics)
        TimedTracker.seconds += time.perf_counter() - started
        TimedTracker.calls += 1

    def flush(self):
        started = time.perf_counter()
        super().flush()
        TimedTracker.seconds += time.perf_counter() - started


def pydoc_dataset(root: Path) -> Path:
    import pydoc_data.topics

    from diffsweep.data.prepare import Document, prepare

    source = root / "topics.txt"
    source.write_text("\n".join(pydoc_data.topics.topics.values()))
    docs = [Document(k, v, source) for k, v in sorted(pydoc_data.topics.topics.items())]
    prepare(docs, root / "data", TokenizerKind.BYTES)
    return root / "data"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path)
    parser.add_argument("--size", default="tiny-m")
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-tracking-"))
    data = args.data or pydoc_dataset(root)
    tokenizer = json.loads((data / "meta.json").read_text())["tokenizer"]
    overrides = [f"model.size={args.size}", f"data.path={data}", f"data.tokenizer={tokenizer}",
                 f"train.max_steps={args.steps}", "train.warmup_steps=10", "train.eval_every=50",
                 "train.eval_tokens=8192", "train.checkpoint_every=100", "train.log_every=1000000"]
    cfg = load_config(None, overrides)
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{root / 'mlflow.db'}"
    from diffsweep.tracking.store import ensure_experiment

    ensure_experiment(os.environ["MLFLOW_TRACKING_URI"], "bench")  # DB creation is set-up, not per step

    results = {}
    for name, tracker_cls in (("mlflow", TimedTracker), ("off", None)):
        if tracker_cls is None:
            original = trainer._start_tracking
            trainer._start_tracking = lambda *a, **k: NullTracker()
        else:
            trainer.MlflowTracker = tracker_cls
        started = time.perf_counter()
        trainer.train(cfg, root / f"run-{name}", experiment="bench", echo=lambda line: None)
        results[name] = time.perf_counter() - started
        if tracker_cls is None:
            trainer._start_tracking = original
    loop = results["mlflow"]
    report = {
        "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} cores, OMP_NUM_THREADS="
                   f"{os.environ['OMP_NUM_THREADS']}",
        "size": args.size,
        "steps": args.steps,
        "tracker_seconds": round(TimedTracker.seconds, 4),
        "tracker_ms_per_step": round(1000 * TimedTracker.seconds / args.steps, 3),
        "step_ms_with_mlflow": round(1000 * loop / args.steps, 2),
        "step_ms_without": round(1000 * results["off"] / args.steps, 2),
        "tracker_fraction_of_step_time": round(TimedTracker.seconds / loop, 5),
        "wall_ratio_with_over_without": round(loop / results["off"], 4),
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
