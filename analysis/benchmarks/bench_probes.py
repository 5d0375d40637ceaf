"""How long each ``diffsweep eval`` probe takes per model size: the demo ladder's sizes on this machine.

For each size of sweeps/demo-ladder.yaml (and ``--kind``), the run's model is built at its
initialisation (a probe's cost does not depend on what the weights learnt, except ``needle``'s
greedy decoding, which stops once every prompt's answer is over: a random model's first token is
no digit, so its time here is a lower bound; a trained model decodes up to digits + 2 tokens) on
the demo corpus's validation split, and every probe runs once with its default settings (``--set`` changes
them, e.g. ``outliers.tokens=65536``) through ``EvalContext`` as ``diffsweep eval`` builds it.
Printed: seconds per probe and size. Needs the demo corpus (``diffsweep data prepare --demo``);
``downstream`` needs lm-eval and task data, and is left out unless named.

    python analysis/benchmarks/bench_probes.py [--kind diff_v1] [--sizes tiny-3xs ... tiny-m]
        [--probes outliers quantization nll_position needle attention_focus] [--set PROBE.KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SIZES = ["tiny-3xs", "tiny-2xs", "tiny-xs", "tiny-s", "tiny-m"]
PROBES = ["outliers", "quantization", "nll_position", "needle", "attention_focus"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kind", default="diff_v1")
    ap.add_argument("--sizes", nargs="+", default=SIZES)
    ap.add_argument("--probes", nargs="+", default=PROBES)
    ap.add_argument("--set", dest="sets", nargs="*", default=[], help="PROBE.KEY=VALUE settings")
    args = ap.parse_args()

    import torch

    from diffsweep.data.dataset import open_dataset
    from diffsweep.data.tokenizers import load_tokenizer
    from diffsweep.eval.probe import EvalContext, probe_requests
    from diffsweep.model.transformer import build_model
    from diffsweep.sweep import expand, load_sweep

    requests = probe_requests(args.probes, args.sets)
    runs = {r.size: r for r in expand(load_sweep(REPO / "sweeps" / "demo-ladder.yaml")).runs if r.kind == args.kind}
    print(f"# {args.kind}, torch threads {torch.get_num_threads()}, load {os.getloadavg()[0]:.1f}; seconds per probe")
    print("| size | params | " + " | ".join(p.name for p, _ in requests) + " |")
    print("|---|---|" + "---|" * len(requests))
    for size in args.sizes:
        run = runs[size]
        dataset = open_dataset(run.config.data.path)
        torch.manual_seed(0)
        model = build_model(run.config.model).eval().requires_grad_(False)
        cells = []
        for probe, settings in requests:
            with tempfile.TemporaryDirectory() as tmp:
                ctx = EvalContext(model=model, config=run.config, tokenizer=load_tokenizer(dataset.meta.tokenizer,
                                  dataset.path), val_tokens=dataset.split("val"), device=torch.device("cpu"),
                                  autocast_dtype=None, out_dir=Path(tmp))
                probe.check(settings, run.config)
                start = time.perf_counter()
                probe.run(ctx, settings)
                cells.append(f"{time.perf_counter() - start:.1f}")
        print(f"| {size} | {run.num_params:,} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
