"""What evaluating more often costs on the demo ladder: one demo run at two eval_every values.

One run of sweeps/demo-ladder.yaml (default: tiny-m DIFF V1, 600 steps of 1,024 tokens) is trained
for real (``diffsweep.train.train``, MLflow into a temporary store) once per eval_every value,
variants interleaved round-robin over ``--repeat`` rounds. Printed per variant: the whole run's
wall time, the median training step, the median evaluation (validation + probes; the extra time of
an evaluating step over a plain one) and how many evaluations ran, then the time of a --project-step
run projected from those medians at each --project-every value. Needs the demo corpus
(``diffsweep data prepare --demo``).

    python analysis/benchmarks/bench_demo_eval.py [--size tiny-m] [--kind diff_v1] [--every 300 50]
                                                  [--steps 600] [--repeat 1] [--project 600 --project-every 300 50]

Under heavy load, time a shorter run (e.g. --steps 30 --every 30 10): the medians of a plain step
and of an evaluation then give the projected time of a full run at each --project-every.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def one_run(size: str, kind: str, every: int, steps: int, out: Path) -> dict[str, float]:
    from diffsweep.sweep import expand, load_sweep
    from diffsweep.train.trainer import train

    spec = load_sweep(REPO / "sweeps" / "demo-ladder.yaml", [f"train.eval_every={every}", f"train.max_steps={steps}",
                                                                    f"train.warmup_steps={min(60, steps // 10)}"])
    (run,) = [r for r in expand(spec).runs if r.size == size and r.kind == kind]
    times: list[tuple[int, float, bool]] = []
    last = [time.perf_counter()]

    def clock(step: int, metrics: dict[str, float]) -> None:
        now = time.perf_counter()
        times.append((step, now - last[0], "val/loss" in metrics))
        last[0] = now

    started = time.perf_counter()
    train(run.config, out / f"{run.name}-e{every}", experiment="bench-demo-eval", callbacks=(clock,), echo=lambda s: None)
    wall = time.perf_counter() - started
    plain = statistics.median(t for _, t, ev in times if not ev)
    evals = [t - plain for _, t, ev in times if ev]
    return {"wall": wall, "step": plain, "eval": statistics.median(evals), "evals": len(evals)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="tiny-m")
    ap.add_argument("--kind", default="diff_v1")
    ap.add_argument("--every", type=int, nargs="+", default=[300, 50])
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--project", type=int, default=600,
                    help="also print the time of a run of this many steps, from the medians ...")
    ap.add_argument("--project-every", type=int, nargs="+", default=[300, 50], help="... at these eval_every values")
    args = ap.parse_args()
    results: dict[int, list[dict[str, float]]] = {e: [] for e in args.every}
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{Path(tmp) / 'mlflow.db'}"
        for r in range(args.repeat):
            for every in args.every:
                res = one_run(args.size, args.kind, every, args.steps, Path(tmp) / f"round{r}")
                results[every].append(res)
                print(f"round {r} eval_every {every}: {res['wall']:.1f} s, step {res['step'] * 1e3:.0f} ms, "
                      f"eval {res['eval']:.2f} s x {res['evals']}, load {os.getloadavg()[0]:.1f}", flush=True)
    print(f"\n{args.kind} {args.size}, {args.steps} steps (median over {args.repeat} round(s)):")
    base = statistics.median(r["wall"] for r in results[args.every[0]])
    for every, rs in results.items():
        wall = statistics.median(r["wall"] for r in rs)
        print(f"  eval_every {every:>4}: {wall:7.1f} s ({wall / base - 1:+.0%}), {rs[0]['evals']} evaluations of "
              f"{statistics.median(r['eval'] for r in rs):.2f} s, steps {statistics.median(r['step'] for r in rs) * 1e3:.0f} ms")
    # A run of --project steps: every step, plus one evaluation per eval_every steps (and at the end).
    step = statistics.median(r["step"] for rs in results.values() for r in rs)
    ev = statistics.median(r["eval"] for rs in results.values() for r in rs)
    print(f"projected for {args.project} steps (median step {step * 1e3:.0f} ms, median evaluation {ev:.2f} s = "
          f"{ev / step:.1f} steps):")
    first = None
    for every in args.project_every:
        n = -(-args.project // every)
        total = args.project * step + n * ev
        first = first or total
        print(f"  eval_every {every:>4}: {n:>3} evaluations, {total:7.1f} s ({total / first - 1:+.0%})")


if __name__ == "__main__":
    main()
