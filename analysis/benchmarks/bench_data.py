"""Pretraining data at paper scale: how fast ``diffsweep data prepare`` tokenizes per worker, what
that means for 10.5B and 360B tokens, and whether the trainer's loader keeps up with an H100.

1. **Prepare.** The demo corpus (``diffsweep data fetch-demo``; Shakespeare + Austen, real
   English) is cut into documents of about ``--doc-bytes`` at line ends (web-page-sized, like
   FineWeb's), repeated ``--copies`` times and written as ``--files`` JSONL files, so prepare makes
   one shard per file. For ``cl100k_base`` and the trained ``bpe`` (``--vocab``), the three steps of
   ``diffsweep.data.prepare`` are timed apart: ``stage`` (serial; for bpe it trains the tokenizer),
   writing the shards with 1 and 2 workers (``_write_all``, the path ``prepare`` takes: in process
   for 1, a spawn pool for more), and ``finish``. Tokens = train + val of the meta.json. A spawn
   pool that only starts its workers, imports and loads the tokenizer is timed on its own
   (start-up); "steady" rates take it out. Also timed: ``tok.encode`` over the same texts in one
   process (the tokenizer alone; prepare adds reading JSONL, splitting, writing and hashing).
   Repeats are interleaved round-robin; medians are reported.
2. **Projection.** Wall time of the tokenizing for 10.5B and 360B tokens on one node of
   ``--node-cores`` workers and on a Slurm array of ``--array-tasks`` x ``--cores-per-task``:
   workers x steady per-worker rate (1 worker) x parallel efficiency measured at 2 workers.
3. **Loader.** Random ``seq_len`` windows per second drawn as the trainer draws them
   (``batch_starts`` per step, ``windows`` per micro-batch; the train config's defaults), from a
   cl100k_base dataset of ``--loader-shards`` shards and from the same tokens as one shard (both
   made by prepare), against what a model of ``--params`` consumes on one H100 at ``--mfu``.

    python analysis/benchmarks/bench_data.py [--sources data/sources] [--json OUT] [--quick]

``--quick``: a 1 MB slice, one repeat, 16 loader shards: seconds, for a smoke run; its rates mean
little. Run the full size on a quiet machine: both workers need a core of their own.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import multiprocessing
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

KINDS = ("cl100k_base", "bpe")
WORKERS = (1, 2)
PAPER_TOKENS = (10.5e9, 360e9)  # the two budgets ("pretraining data at paper scale")
H100_BF16_DENSE = 989e12  # FLOP/s, NVIDIA H100 SXM datasheet (bf16 dense, no sparsity)


# --- the corpus ------------------------------------------------------------------------------------


def corpus_texts(sources: Path, doc_bytes: int, max_bytes: int | None) -> list[str]:
    """The demo corpus cut into documents of about ``doc_bytes`` (whole lines), at most ``max_bytes``."""
    from diffsweep.data.demo import demo_documents

    texts: list[str] = []
    total = 0
    for doc in demo_documents(sources):
        chunk: list[str] = []
        size = 0
        for line in doc.text.splitlines(keepends=True):
            chunk.append(line)
            size += len(line)
            if size >= doc_bytes:
                texts.append("".join(chunk))
                total += size
                chunk, size = [], 0
                if max_bytes is not None and total >= max_bytes:
                    return texts
        if chunk and "".join(chunk).strip():
            texts.append("".join(chunk))
            total += size
    return texts


def write_jsonl(texts: list[str], directory: Path, num_files: int) -> list[Path]:
    """``texts`` in order as ``num_files`` JSONL files of about equal size (one shard each)."""
    directory.mkdir(parents=True)
    total = sum(len(t) for t in texts)
    paths = [directory / f"part-{i:03d}.jsonl" for i in range(num_files)]
    files = [open(p, "w", encoding="utf-8") for p in paths]
    try:
        written = 0
        for text in texts:
            index = min(num_files - 1, written * num_files // total)
            files[index].write(json.dumps({"text": text}) + "\n")
            written += len(text)
    finally:
        for f in files:
            f.close()
    return paths


# --- prepare, step by step -------------------------------------------------------------------------


def _load_in_worker(staging: str) -> int:
    """What a prepare worker does before its first document: import, read the plan, load the tokenizer."""
    from diffsweep.data import shards

    shards._tokenizer(Path(staging), shards.read_plan(Path(staging)))
    return os.getpid()


def start_up_seconds(staging: Path, workers: int) -> float:
    """Seconds to start ``workers`` spawn processes (as ``_write_all`` does), each loading the
    tokenizer, and shut them down; for 1 worker, loading the tokenizer in this process."""
    from diffsweep.data import shards

    started = time.perf_counter()
    if workers == 1:
        shards._TOKENIZERS.clear()
        shards._tokenizer(staging, shards.read_plan(staging))
        shards._TOKENIZERS.clear()
        return time.perf_counter() - started
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
        pids = set(pool.map(_load_in_worker, [str(staging)] * workers))
    assert pids, "no worker answered"
    return time.perf_counter() - started


def _fresh_staging(template: Path, work: Path, name: str) -> Path:
    """A copy of the staged plan and tokenizer with no shard written yet."""
    staging = work / name
    staging.mkdir()
    for item in template.iterdir():
        shutil.copy2(item, staging / item.name)
    return staging


def bench_prepare(kind: str, inputs: Path, work: Path, *, vocab: int, repeat: int) -> dict[str, Any]:
    """stage / write (1 and 2 workers) / finish seconds, tokens, start-up, and plain encode speed."""
    from diffsweep.config import TokenizerKind
    from diffsweep.data import prepare, shards
    from diffsweep.data.sources import Corpus, open_sources
    from diffsweep.data.tokenizers import load_tokenizer

    tokenizer = TokenizerKind(kind)
    template = work / f"{kind}-template"
    template.mkdir()
    started = time.perf_counter()
    staged = prepare.stage(Corpus(open_sources([inputs])), template, tokenizer, vocab_size=vocab,
                           val_fraction=0.05, val_split="tail", max_tokens=None, shard_size=1)
    stage_s = time.perf_counter() - started
    write_s: dict[int, list[float]] = {w: [] for w in WORKERS}
    finish_s: list[float] = []
    start_s: dict[int, list[float]] = {w: [] for w in WORKERS}
    tokens: set[int] = set()
    fingerprints: set[tuple[str, ...]] = set()
    for r in range(repeat):
        for workers in WORKERS:  # round-robin: machine load hits both alike
            start_s[workers].append(start_up_seconds(template, workers))
            staging = _fresh_staging(template, work, f"{kind}-{workers}-{r}")
            shards._TOKENIZERS.clear()  # as a fresh `data prepare` process: the tokenizer loads in the timing
            started = time.perf_counter()
            prepare._write_all(prepare.Staged(staging, staged.num_shards, staged.shard_bytes), workers, None)
            write_s[workers].append(time.perf_counter() - started)
            started = time.perf_counter()
            meta = prepare.finish(staging, work / f"{kind}-{workers}-{r}-out")
            finish_s.append(time.perf_counter() - started)
            tokens.add(meta.tokens["train"] + meta.tokens["val"])
            fingerprints.add((meta.fingerprint, *((s.sha256 or {}).get("train") for s in meta.shards or [])))
            shutil.rmtree(work / f"{kind}-{workers}-{r}-out")
    assert len(tokens) == 1 and len(fingerprints) == 1, "1 and 2 workers wrote different datasets"
    (num_tokens,) = tokens
    # The tokenizer alone, in this process, over the same texts (read back from the JSONL files).
    tok = load_tokenizer(tokenizer, template)
    texts = [json.loads(line)["text"] for path in sorted(inputs.glob("*.jsonl")) for line in path.open()]
    encode_s = []
    for _ in range(repeat):
        started = time.perf_counter()
        encoded = sum(len(tok.encode(t)) for t in texts)
        encode_s.append(time.perf_counter() - started)
    text_bytes = sum(len(t.encode()) for t in texts)

    med = {w: statistics.median(write_s[w]) for w in WORKERS}
    start = {w: statistics.median(start_s[w]) for w in WORKERS}
    # Start-up is taken out whole: the workers spawn together, so it is a latency, not work per worker.
    # When it is not well below the write time (tiny inputs, a busy machine) there is no steady rate.
    steady = {w: med[w] - start[w] if med[w] - start[w] > 0.2 * med[w] else None for w in WORKERS}
    row: dict[str, Any] = {
        "tokenizer": kind, "shards": staged.num_shards, "tokens": num_tokens, "text_bytes": text_bytes,
        "bytes_per_token": text_bytes / num_tokens, "stage_s": stage_s,
        "finish_s": statistics.median(finish_s), "encode_tokens_per_s": encoded / statistics.median(encode_s),
        "identical_for_1_and_2_workers": True,
    }
    for w in WORKERS:
        row[f"write_s_w{w}"] = med[w]
        row[f"startup_s_w{w}"] = start[w]
        row[f"tokens_per_s_per_worker_w{w}"] = num_tokens / med[w] / w
        row[f"steady_tokens_per_s_per_worker_w{w}"] = num_tokens / steady[w] / w if steady[w] else None
    row["speedup_2v1"] = med[1] / med[2]
    row["steady_speedup_2v1"] = steady[1] / steady[2] if steady[1] and steady[2] else None
    # What the projection scales by: steady when measured, else end to end (start-up included).
    row["efficiency_from"] = "steady" if row["steady_speedup_2v1"] else "end-to-end"
    # Capped at 1: a speed-up above 2x from 2 workers is noise (or the 1-worker run in the process
    # that trained the tokenizer running slower), not something more cores would keep giving.
    row["parallel_efficiency"] = min(1.0, (row["steady_speedup_2v1"] or row["speedup_2v1"]) / 2)
    return row


# --- projection ------------------------------------------------------------------------------------


def project(row: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """Hours to tokenize the paper budgets: workers x steady 1-worker rate x efficiency at 2 workers."""
    rate = row["steady_tokens_per_s_per_worker_w1"] or row["tokens_per_s_per_worker_w1"]
    efficiency = row["parallel_efficiency"]
    layouts = {"node": args.node_cores, "array": args.array_tasks * args.cores_per_task}
    out: dict[str, Any] = {"tokenizer": row["tokenizer"], "per_worker_tokens_per_s": rate,
                           "parallel_efficiency": efficiency, "efficiency_from": row["efficiency_from"]}
    for name, workers in layouts.items():
        throughput = workers * rate * efficiency
        out[f"{name}_workers"] = workers
        out[f"{name}_tokens_per_s"] = throughput
        for budget in PAPER_TOKENS:
            seconds = budget / throughput
            out[f"{name}_hours_{budget / 1e9:g}B"] = seconds / 3600
            # What the file system must sustain: text read in, uint32 tokens written out.
            out[f"{name}_read_MBps_{budget / 1e9:g}B"] = budget * row["bytes_per_token"] / seconds / 1e6
    return out


# --- the loader ------------------------------------------------------------------------------------


def bench_loader(texts: list[str], work: Path, *, shards: int, steps: int, repeat: int, seq_len: int | None,
                 workers: int) -> dict[str, Any]:
    """Windows/s sampled as the trainer samples them, from ``shards`` shards and from one."""
    import numpy as np

    from diffsweep.config import TokenizerKind
    from diffsweep.config.schema import TrainConfig
    from diffsweep.data.dataset import ShardedTokens, batch_starts, open_dataset, windows
    from diffsweep.data.prepare import prepare
    from diffsweep.data.sources import Corpus, open_sources

    t = TrainConfig()
    seq_len = seq_len or t.seq_len
    per_step = t.batch_tokens // seq_len  # sequences per step (the default batch of 262,144 tokens)
    micro = t.micro_batch_size
    datasets: dict[str, Any] = {}
    for name, num_files in (("many", shards), ("one", 1)):
        inputs = work / f"loader-{name}-in"
        write_jsonl(texts, inputs, num_files)
        prepare(Corpus(open_sources([inputs])), work / f"loader-{name}", TokenizerKind.CL100K_BASE,
                workers=min(workers, num_files), shard_size=1)
        shutil.rmtree(inputs)
        datasets[name] = open_dataset(work / f"loader-{name}").split("train")
    assert isinstance(datasets["many"], ShardedTokens) and not isinstance(datasets["one"], ShardedTokens)
    assert len(datasets["many"]) == len(datasets["one"]) > seq_len + 1, "too few tokens for one window"
    num_tokens = len(datasets["one"])
    probe = batch_starts(0, 1, 8, num_tokens, seq_len)
    same = [windows(tokens, probe, seq_len) for tokens in datasets.values()]
    assert np.array_equal(same[0], same[1]), "the shards do not read as the same token stream"

    seconds: dict[str, list[float]] = {name: [] for name in datasets}
    for _ in range(repeat):
        for name, tokens in datasets.items():  # round-robin
            started = time.perf_counter()
            for step in range(1, steps + 1):
                starts = batch_starts(t.seed, step, per_step, num_tokens, seq_len)
                for i in range(0, per_step - micro + 1, micro):
                    windows(tokens, starts[i : i + micro], seq_len)
            seconds[name].append(time.perf_counter() - started)
    num_windows = steps * (per_step // micro) * micro
    sharded = datasets["many"]
    return {
        "seq_len": seq_len, "sequences_per_step": per_step, "micro_batch": micro, "steps": steps,
        "shards": len(sharded._parts), "train_tokens": num_tokens, "dtype": str(sharded.dtype),
        "windows_per_s_many_shards": num_windows / statistics.median(seconds["many"]),
        "windows_per_s_one_shard": num_windows / statistics.median(seconds["one"]),
    }


def h100_demand(args: argparse.Namespace, seq_len: int) -> dict[str, Any]:
    """Tokens and windows per second a model of ``params`` trains on at ``mfu`` of an H100 (6N FLOPs/token)."""
    tokens_per_s = args.mfu * args.peak_tflops * 1e12 / (6 * args.params)
    return {"params": args.params, "mfu": args.mfu, "peak_tflops": args.peak_tflops,
            "tokens_per_s": tokens_per_s, "windows_per_s": tokens_per_s / seq_len}


# --- main ------------------------------------------------------------------------------------------


def _num(x: float | None, spec: str) -> str:
    return "—" if x is None else format(x, spec)


def _hours(h: float) -> str:
    return f"{h * 60:.1f} min" if h < 1 else f"{h:.1f} h"


def report(results: dict[str, Any]) -> None:
    a = results["assumptions"]
    print(f"\ncorpus: demo (Shakespeare + Austen) in documents of ~{a['doc_bytes']} B, x{a['copies']} copies, "
          f"{a['files']} JSONL files = {a['files']} shards; {a['cpus']} CPUs visible; python {a['python']}")
    if a["quick"]:
        print("quick: a 1 MB slice, one repeat: a smoke run; start-up swamps these rates, do not quote them")
    print("\n## 1. data prepare, tokens/s (medians of", a["repeat"], "interleaved repeats)\n")
    print("| tokenizer | tokens | B/token | stage s | write s 1w | write s 2w | start-up 1w / 2w s | "
          "tok/s/worker 1w | 2w | steady 1w | steady 2w | speed-up 2v1 (steady) | encode-only tok/s |")
    print("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
    for r in results["prepare"]:
        print(f"| {r['tokenizer']} | {r['tokens']:,} | {r['bytes_per_token']:.2f} | {r['stage_s']:.2f} | "
              f"{r['write_s_w1']:.2f} | {r['write_s_w2']:.2f} | {r['startup_s_w1']:.2f} / {r['startup_s_w2']:.2f} | "
              f"{r['tokens_per_s_per_worker_w1']:,.0f} | {r['tokens_per_s_per_worker_w2']:,.0f} | "
              f"{_num(r['steady_tokens_per_s_per_worker_w1'], ',.0f')} | "
              f"{_num(r['steady_tokens_per_s_per_worker_w2'], ',.0f')} | "
              f"{r['speedup_2v1']:.2f}x ({_num(r['steady_speedup_2v1'], '.2f')}x; target >= 1.8x) | "
              f"{r['encode_tokens_per_s']:,.0f} |")
    print("\nstage: bpe trains its tokenizer there (serial, one pass over every document; HF tokenizers may use "
          "several threads); cl100k_base only loads it. steady = write s minus start-up (1w: loading the "
          "tokenizer in process; 2w: spawning 2 processes that import diffsweep and load it). Datasets "
          "written by 1 and 2 workers: identical (fingerprint and shard sha256). —: start-up is not "
          "well below the write time (inputs too small, or a busy machine), so no steady rate.")
    print(f"\n## 2. projection: {a['node_cores']}-core node and a Slurm array of {a['array_tasks']} tasks x "
          f"{a['cores_per_task']} cores\n")
    print("assumed: one worker per core; each worker at the steady 1-worker rate measured here, times the "
          "parallel efficiency measured at 2 workers (steady speed-up / 2, at most 1), held constant up to every core "
          "(end to end where there is no steady figure); "
          "an array task runs its shards with one worker per core; start-up, stage and finish left out "
          "(seconds); read = text MB/s the file system must deliver.\n")
    print("| tokenizer | tok/s/worker | efficiency | layout | workers | tokens/s | 10.5B | 360B | read MB/s (360B) |")
    print("|---|--:|--:|---|--:|--:|--:|--:|--:|")
    for p in results["projection"]:
        for layout in ("node", "array"):
            print(f"| {p['tokenizer']} | {p['per_worker_tokens_per_s']:,.0f} | {p['parallel_efficiency']:.2f}"
                  f"{'' if p['efficiency_from'] == 'steady' else ' (end to end)'} | "
                  f"{layout} | {p[f'{layout}_workers']} | {p[f'{layout}_tokens_per_s']:.3g} | "
                  f"{_hours(p[f'{layout}_hours_10.5B'])} | {_hours(p[f'{layout}_hours_360B'])} | "
                  f"{p[f'{layout}_read_MBps_360B']:,.0f} |")
    bpe = next((r for r in results["prepare"] if r["tokenizer"] == "bpe"), None)
    if bpe is not None:
        print(f"\nbpe stage (training) took {bpe['stage_s']:.2f} s for {bpe['text_bytes'] / 1e6:.1f} MB of text; it is "
              "serial and holds every distinct word in memory: not a paper-scale path (the paper uses cl100k_base).")
    lo, d = results["loader"], results["h100"]
    print(f"\n## 3. loader: random windows of {lo['seq_len']} tokens ({lo['dtype']}), {lo['sequences_per_step']} "
          f"per step in micro-batches of {lo['micro_batch']} (train config defaults), {lo['steps']} steps, "
          f"{lo['train_tokens']:,} train tokens, page cache warm\n")
    print(f"assumed consumer: {d['params'] / 1e9:g}B parameters, 6N FLOPs/token, {d['mfu']:.0%} MFU of "
          f"{d['peak_tflops']:g} TFLOP/s (H100 bf16 dense) = {d['tokens_per_s']:,.0f} tokens/s = "
          f"{d['windows_per_s']:.1f} windows/s\n")
    print("| dataset | windows/s | x what one H100 consumes (target >= 100x) |")
    print("|---|--:|--:|")
    for label, key in ((f"{lo['shards']} shards", "many_shards"), ("1 shard", "one_shard")):
        print(f"| {label} | {lo[f'windows_per_s_{key}']:,.0f} | {lo[f'ratio_{key}']:,.0f}x |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sources", type=Path, default=Path("data/sources"), help="where fetch-demo put the archives")
    parser.add_argument("--quick", action="store_true", help="small sizes, one repeat: a smoke run in seconds")
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    parser.add_argument("--doc-bytes", type=int, default=4096, help="document size the corpus is cut to")
    parser.add_argument("--copies", type=int, default=8, help="times the demo corpus (~9 MB) is repeated")
    parser.add_argument("--files", type=int, default=8, help="JSONL files = shards for the prepare timing")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--vocab", type=int, default=4096, help="bpe vocabulary")
    parser.add_argument("--loader-shards", type=int, default=64)
    parser.add_argument("--loader-steps", type=int, default=20, help="training steps of windows drawn")
    parser.add_argument("--seq-len", type=int, default=None, help="default: the train config's (2048)")
    parser.add_argument("--node-cores", type=int, default=64)
    parser.add_argument("--array-tasks", type=int, default=16)
    parser.add_argument("--cores-per-task", type=int, default=32)
    parser.add_argument("--params", type=float, default=1.4e9)
    parser.add_argument("--mfu", type=float, default=0.40)
    parser.add_argument("--peak-tflops", type=float, default=H100_BF16_DENSE / 1e12)
    args = parser.parse_args()
    max_bytes = None
    if args.quick:
        max_bytes, args.copies, args.files, args.repeat = 1_000_000, 1, 4, 1
        args.loader_shards, args.loader_steps = 16, 2
    from diffsweep.config import ConfigError

    try:
        texts = corpus_texts(args.sources, args.doc_bytes, max_bytes)
    except ConfigError as exc:
        sys.exit(f"error: {exc}")
    texts = texts * args.copies
    results: dict[str, Any] = {"assumptions": {
        "doc_bytes": args.doc_bytes, "copies": args.copies, "files": args.files, "repeat": args.repeat,
        "quick": args.quick, "cpus": len(os.sched_getaffinity(0)), "python": sys.version.split()[0],
        "node_cores": args.node_cores, "array_tasks": args.array_tasks, "cores_per_task": args.cores_per_task,
        "paper_tokens": list(PAPER_TOKENS),
    }}
    with tempfile.TemporaryDirectory(prefix="bench-data-") as tmp:
        work = Path(tmp)
        inputs = work / "inputs"
        write_jsonl(texts, inputs, args.files)
        results["prepare"] = [bench_prepare(kind, inputs, work, vocab=args.vocab, repeat=args.repeat)
                              for kind in KINDS]
        shutil.rmtree(inputs)
        results["projection"] = [project(row, args) for row in results["prepare"]]
        loader = bench_loader(texts[: len(texts) // args.copies], work, shards=args.loader_shards,
                              steps=args.loader_steps, repeat=args.repeat, seq_len=args.seq_len,
                              workers=min(2, len(os.sched_getaffinity(0))))
    demand = h100_demand(args, loader["seq_len"])
    for key in ("many_shards", "one_shard"):
        loader[f"ratio_{key}"] = loader[f"windows_per_s_{key}"] / demand["windows_per_s"]
    results["loader"], results["h100"] = loader, demand
    report(results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
