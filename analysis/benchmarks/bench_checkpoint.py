"""What a checkpoint costs on several processes: sharded DCP (``diffsweep.train.checkpoint``, every
rank writes its own shards) against gathering the full state on rank 0 into one file (what
diffsweep did before, and what a home-made ``torch.save`` does).

The script starts ``torchrun --nproc-per-node N`` once per way of saving (a fresh process group,
so one case's heap cannot shrink the other's peak). Each rank builds the model (FSDP2 on gloo),
takes one AdamW step on a small batch, then saves; per rank it reports the seconds, the peak
resident set above the resident set just before the save (``VmHWM``, reset there) and the bytes
it wrote. The sharded checkpoint is then loaded back: on N processes (resharded in place) and on
one process (DCP reshards N → 1), each timed, and the loaded weights are compared with the saved
ones bitwise.

    python analysis/benchmarks/bench_checkpoint.py [--nproc 2] [--size 830M] [--layers 4]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def _peak_rss_bytes() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _reset_peak_rss() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _dir_bytes(path: Path, rank: int | None = None) -> int:
    files = [p for p in path.rglob("*") if p.is_file()]
    if rank is not None:
        files = [p for p in files if p.name.startswith(f"__{rank}_")]
    return sum(p.stat().st_size for p in files)


def _model(args, world):
    import torch

    from diffsweep.config import Parallel, load_config
    from diffsweep.model.transformer import build_model
    from diffsweep.train import distributed
    from diffsweep.train.optim import build_optimizer

    config = load_config(None, [f"model.size={args.size}", f"model.n_layers={args.layers}",
                                "model.attention.kind=diff_v1"])
    torch.manual_seed(0)
    model = distributed.wrap(build_model(config.model), Parallel.FSDP, world, torch.device("cpu"), None)
    return config, model, build_optimizer(model, config.train)


@contextmanager
def _measured(into: dict) -> Iterator[None]:
    """Seconds and peak RSS above the resident set at entry, into ``into``."""
    gc.collect()
    base = _rss_bytes()
    _reset_peak_rss()
    started = time.perf_counter()
    yield
    into["seconds"] = time.perf_counter() - started
    into["peak"] = _peak_rss_bytes() - base


def _load_back(out: Path, model, optimizer) -> tuple[dict, dict]:
    """Fill a fresh model and optimizer from ``out/sharded``: its weights and the measurement."""
    from diffsweep.train import checkpoint as ckpt
    from diffsweep.train import distributed

    tensors, _ = distributed.sharded_state(model, optimizer)
    measured: dict = {}
    with _measured(measured):
        ckpt.load_tensors(out / "sharded", tensors)
    return {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in tensors["model"].items()}, measured


def child(args) -> None:
    """One torchrun rank (or the single loading process)."""
    import torch
    import torch.distributed as dist

    from diffsweep.train import checkpoint as ckpt
    from diffsweep.train import distributed

    world = distributed.world_from_env()
    out = Path(args.out)
    with distributed.process_group(world, torch.device("cpu")):
        config, model, optimizer = _model(args, world)
        if args.case == "load-1":
            weights, measured = _load_back(out, model, optimizer)
            reference = torch.load(out / "reference.pt", weights_only=True)
            _report(out, args.case, 0, written=0, same=all(torch.equal(weights[k], v) for k, v in reference.items()),
                    **measured)
            return
        tokens = torch.randint(0, config.model.vocab_size, (1, 65), generator=torch.Generator().manual_seed(0))
        logits = model(tokens[:, :-1])
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[0, 1:]).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del logits
        dist.barrier()
        measured: dict = {}
        with _measured(measured):
            if args.case == "sharded":
                tensors, groups = distributed.sharded_state(model, optimizer)
                path = ckpt.save_checkpoint(out / "sharded-dir", {"step": 1, "groups": groups}, tensors, keep=1)
                written = _dir_bytes(path, world.rank) + ((path / ".metadata").stat().st_size if world.rank == 0 else 0)
            else:
                from torch.distributed.checkpoint.state_dict import (
                    StateDictOptions,
                    get_model_state_dict,
                    get_optimizer_state_dict,
                )

                full = StateDictOptions(full_state_dict=True, cpu_offload=True)
                model_state = get_model_state_dict(model, options=full)
                optim_state = get_optimizer_state_dict(model, optimizer, options=full)
                written = 0
                if world.rank == 0:
                    torch.save({"model": model_state, "optimizer": optim_state}, out / "full.pt")
                    written = (out / "full.pt").stat().st_size
                dist.barrier()
        _report(out, args.case, world.rank, written=written, **measured)
        if args.case != "sharded":
            return
        # The reference weights, then load back on N processes into a fresh model.
        reference = {k: v.full_tensor() for k, v in tensors["model"].items()}
        if world.rank == 0:
            os.replace(path, out / "sharded")
            torch.save(reference, out / "reference.pt")
        dist.barrier()
        del model, optimizer, tensors
        torch.manual_seed(1)
        _, fresh, fresh_optimizer = _model(args, world)
        weights, measured = _load_back(out, fresh, fresh_optimizer)
        _report(out, f"load-{world.world_size}", world.rank, written=0,
                same=all(torch.equal(weights[k], v) for k, v in reference.items()), **measured)


def _report(out: Path, case: str, rank: int, **values) -> None:
    with open(out / f"{case}.{rank}.json", "w") as f:
        json.dump({"case": case, "rank": rank, **values}, f)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--size", default="830M", help="size preset whose widths are used")
    parser.add_argument("--layers", type=int, default=4, help="layers (fewer than the preset's, to fit a CPU box)")
    parser.add_argument("--case", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        child(args)
        return
    import torch

    from diffsweep.config import load_config
    from diffsweep.model import counting

    config = load_config(None, [f"model.size={args.size}", f"model.n_layers={args.layers}", "model.attention.kind=diff_v1"])
    params = counting.num_params(config.model)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        me = [sys.argv[0], "--size", args.size, "--layers", str(args.layers), "--out", tmp]
        for case in ("full-on-rank-0", "sharded"):
            subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                            f"--nproc-per-node={args.nproc}", *me, "--case", case], check=True, env=env)
        subprocess.run([sys.executable, *me, "--case", "load-1"], check=True, env=env)
        for path in sorted(Path(tmp).glob("*.json")):
            rows.append(json.loads(path.read_text()))
    print(f"\nDIFF V1 {args.size} widths, {args.layers} layers: {params / 1e6:.0f}M parameters; fp32 weights + AdamW "
          f"state = {params * 12 / 2**30:.2f} GiB; {args.nproc} processes (FSDP2, gloo), torch {torch.__version__}\n")
    print("| case | rank | seconds | peak RSS above pre-save | written | loaded bitwise |")
    print("|---|--:|--:|--:|--:|---|")
    order = {"full-on-rank-0": 0, "sharded": 1, f"load-{args.nproc}": 2, "load-1": 3}
    for r in sorted(rows, key=lambda r: (order.get(r["case"], 9), r["rank"])):
        print(f"| {r['case']} | {r['rank']} | {r['seconds']:.2f} | {r['peak'] / 2**30:.2f} GiB | "
              f"{r['written'] / 2**30:.2f} GiB | {r.get('same', '')} |")


if __name__ == "__main__":
    main()
