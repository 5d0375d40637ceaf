"""``diffsweep data prepare``: tokenize documents into a sharded dataset directory (see ``dataset``).

The work is cut into **shards**, groups of input files (or row ranges of a saved Hugging Face
dataset) of about ``shard_size`` bytes on disk (``sources.plan_shards``); shard ``i`` becomes
``train-{i:05d}.bin`` and ``val-{i:05d}.bin``, and the shards never depend on how many processes
write them. Three steps, each usable on its own: ``stage`` (tokenizer and plan, in a staging folder
beside the destination), ``write_shards`` (in ``shards``; what a Slurm array task runs) and ``finish``
(check, cut at ``max_tokens``, move into place). ``prepare`` runs the three in this process and
``workers`` processes, and leaves nothing behind when it fails. Each document is split between train
and validation by ``val_split`` (``tail`` or ``document``); every part ends with the tokenizer's
end-of-document token when it has one. See docs/training.md, 'Shards, workers and the validation split'.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from diffsweep.config import ConfigError, TokenizerKind
from diffsweep.data.dataset import (
    META_FILE,
    SPLITS,
    VAL_SPLITS,
    DatasetMeta,
    ShardMeta,
    check_replaceable,
    shard_file,
)
from diffsweep.data.shards import (
    PLAN_FILE,
    PLAN_FORMAT,
    PreparePlan,
    ShardRecord,
    read_plan,
    record_name,
    shard_record,
    write_in_order,
    write_json,
    write_plan,
    write_shard,
)
from diffsweep.data.sources import (
    Corpus,
    Document,
    Source,
    check_text,
    combine_hashes,
    from_recipe,
    plan_shards,
    sha256_file,
)
from diffsweep.data.tokenizers import check_bpe_vocab, has_eos, new_tokenizer
from diffsweep.fsutil import parents_made_for, publish

__all__ = ["VAL_SPLITS", "Corpus", "Document", "prepare"]  # Document and Corpus: what prepare takes
# Wraps a stream of progress increments (bytes of text; for shards written by workers, of each
# finished shard's files), given the total when known, to show a progress bar.
Progress = Callable[[Iterable[int], int | None], Iterable[int]]

SHARD_SIZE = 256 * 2**20  # bytes of input per shard (default of --shard-size)


class _Listed:
    """Documents already in memory (the demo corpus, tests), as a ``Corpus`` of one shard written in
    this process: meta.json lists the files they came from (each once, sorted), with sha256 and size."""

    sample: float | None = None
    seed: int = 0

    def __init__(self, documents: Sequence[Document]) -> None:
        if not documents:
            raise ConfigError("INPUTS", "no documents to tokenize")
        for doc in documents:  # an empty file would still make a dataset: of end-of-document tokens only
            if not doc.text.strip():
                raise ConfigError(doc.name, "no text (empty or only whitespace)")
            check_text(doc.name, doc.text)
        self._documents = documents
        self._files = sorted({d.source for d in documents})
        self._described: list[dict[str, Any]] | None = None

    def documents(self) -> Iterator[Document]:
        return iter(self._documents)

    def describe(self) -> list[dict[str, Any]]:
        if self._described is None:
            self._described = [{"path": str(p), "sha256": sha256_file(p), "bytes": p.stat().st_size}
                               for p in self._files]
        return self._described


@dataclass(frozen=True)
class Staged:
    """A staging folder made by ``stage``: what ``write_shards`` and ``finish`` work on."""

    path: Path
    num_shards: int
    shard_bytes: list[int]  # input bytes of each shard (for progress bars and array task groups)


def prepare(
    documents: Sequence[Document] | Corpus,
    out: Path,
    tokenizer: TokenizerKind,
    *,
    vocab_size: int = 4096,
    val_fraction: float = 0.05,
    val_split: str = "tail",
    force: bool = False,
    progress: Progress | None = None,
    max_tokens: int | None = None,
    workers: int = 1,
    shard_size: int = SHARD_SIZE,
) -> DatasetMeta:
    """Tokenize ``documents`` (a list, or a ``Corpus`` read lazily) into the dataset directory
    ``out`` and return its metadata.

    ``vocab_size`` only applies to ``bpe``, trained here on every document of the corpus (one
    pass, before the pass that writes the tokens). ``max_tokens`` stops writing once that many
    tokens (train + val) are written: the document that crosses it is cut to fit (its first
    tokens, split as any other), so the dataset has exactly ``max_tokens`` tokens unless the room
    left is too small for a token and its end-of-document tokens (then it is dropped and the
    dataset is 1 or 2 tokens short). ``workers`` processes write the shards (a list of documents is
    one shard, written here).
    """
    check_out(out, input_paths(documents), force=force)
    if workers < 1:
        raise ConfigError("workers", f"expected at least 1 worker, got {workers}")
    try:
        with parents_made_for(out):
            _check_writable(out)
            staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
            try:
                staged = stage(documents, staging, tokenizer, vocab_size=vocab_size, val_fraction=val_fraction,
                               val_split=val_split, max_tokens=max_tokens, shard_size=shard_size)
                if isinstance(documents, Sequence):
                    _write_listed(staged, documents, progress)
                else:
                    _write_all(staged, workers, progress)
                return finish(staging, out, force=force)
            except BaseException:
                shutil.rmtree(staging, ignore_errors=True)
                raise
    except OSError as exc:
        raise ConfigError(str(out), f"cannot write it ({exc.strerror or exc})") from None


def input_paths(documents: Sequence[Document] | Corpus) -> list[Path]:
    """The paths the corpus is read from: each INPUT given (a file, or a directory searched) and
    each file found, or the files of documents given as a list."""
    if isinstance(documents, Sequence):
        return sorted({d.source for d in documents})
    paths: list[Path] = []
    for source in documents.sources:
        for path in (source.given, getattr(source, "path", None)):
            if path is not None and path not in paths:
                paths.append(path)
    return paths


def check_out(out: Path, inputs: Iterable[Path], *, force: bool) -> None:
    """The one check of ``--out`` and ``--force`` (``data prepare``, with or without ``--launch``):
    ``out`` is not, holds no and lies in no input (symlinks resolved), and it does not exist, or
    ``force`` is given and it is a dataset ``data prepare`` wrote (``check_replaceable``)."""
    check_apart(out, inputs, "out")
    if out.exists() or out.is_symlink():
        if not force:
            raise ConfigError(str(out), "already exists (pass --force to replace it)")
        check_replaceable(out)


def check_apart(path: Path, inputs: Iterable[Path], key: str) -> None:
    """Refuse a folder to write (``key``) that is, contains or lies inside one of ``inputs``:
    writing or replacing it would overwrite or delete the corpus."""
    target = path.resolve()
    for given in inputs:
        real = given.resolve()
        if target == real:
            where = "is"
        elif target in real.parents:
            where = "contains"
        elif real in target.parents:
            where = "lies inside"
        else:
            continue
        raise ConfigError(key, f"{path} {where} the input {given}: the dataset must go to a folder apart from its "
                          "inputs (nothing was written or deleted)")


# --- step 1: the plan ------------------------------------------------------------------------------


def check_settings(tokenizer: TokenizerKind, *, vocab_size: int, val_fraction: float, val_split: str,
                   max_tokens: int | None) -> None:
    """The one check of ``data prepare``'s tokenizer and split settings (``--vocab-size`` with bpe,
    ``--val-fraction``, ``--val-split``, ``--max-tokens``), before anything is read or written."""
    if tokenizer is TokenizerKind.BPE:
        check_bpe_vocab(vocab_size)
    if not 0.0 < val_fraction < 1.0:
        raise ConfigError("val_fraction", f"expected a value in (0, 1), got {val_fraction}")
    if val_split not in VAL_SPLITS:
        raise ConfigError("val_split", f"expected one of {', '.join(VAL_SPLITS)}, got {val_split!r}")
    # The first document must fit: one token and the end-of-document token of each part it writes.
    smallest = 1 + (0 if not has_eos(tokenizer) else 1 if val_split == "document" else 2)
    if max_tokens is not None and max_tokens < smallest:
        raise ConfigError("max_tokens", f"expected at least {smallest} token{'s' if smallest > 1 else ''} with the {tokenizer.value} tokenizer "
                          f"and --val-split {val_split} (a document's first token and its end-of-document tokens), "
                          f"got {max_tokens}")


def stage(documents: Sequence[Document] | Corpus, staging: Path, tokenizer: TokenizerKind, *, vocab_size: int,
          val_fraction: float, val_split: str, max_tokens: int | None, shard_size: int) -> Staged:
    """Check the settings, make the tokenizer and write the plan into the (existing) ``staging``:
    train the tokenizer (``bpe``: on every document, one pass), plan the shards and write both into
    the staging folder beside the destination (``plan.json``, ``tokenizer.json``)."""
    check_settings(tokenizer, vocab_size=vocab_size, val_fraction=val_fraction, val_split=val_split,
                   max_tokens=max_tokens)
    corpus: _Listed | Corpus
    shards: list[list[Source]]
    listed: list[dict[str, Any]] | None
    if isinstance(documents, Sequence):
        corpus, shards = _Listed(documents), [[]]
        listed = corpus.describe()
    else:
        corpus, shards, listed = documents, plan_shards(documents.sources, shard_size), None
    texts = corpus.documents
    tok = new_tokenizer(tokenizer, lambda: (d.text for d in texts()), vocab_size)
    tok.save(staging)
    shard_bytes = [sum(s.stored_bytes for s in group) for group in shards]
    write_plan(staging, PreparePlan(
        format=PLAN_FORMAT, tokenizer=tok.kind, vocab_size=tok.vocab_size, eos_id=tok.eos_id,
        tokenizer_sha256=tok.fingerprint(), tokenizer_version=_library_version(tok.kind),
        dtype="uint16" if tok.vocab_size <= 1 << 16 else "uint32",
        val_fraction=val_fraction, val_split=val_split, max_tokens=max_tokens,
        sample=corpus.sample, seed=corpus.seed,
        listed=listed,
        shards=[[s.recipe() for s in group] for group in shards],
        shard_bytes=shard_bytes,
    ))
    return Staged(staging, len(shards), shard_bytes)


# --- step 2: the shards (``shards``), as ``prepare`` drives it -------------------------------------


def _write_listed(staged: Staged, documents: Sequence[Document], progress: Progress | None) -> None:
    """The one shard of documents given as a list, in this process, a progress step per document
    (the progress wrapper drives the iteration, so a Ctrl-C it raises stops the writing)."""
    budget = read_plan(staged.path).max_tokens  # applied here: finish cannot read a list again
    if progress is None:
        write_shard(staged.path, 0, documents=documents, budget=budget)
        return
    steps = iter(progress((len(d.text) for d in documents), sum(len(d.text) for d in documents)))
    write_shard(staged.path, 0, documents=_stepped(documents, steps), budget=budget)


def _stepped(documents: Iterable[Document], steps: Iterator[int]) -> Iterator[Document]:
    for doc in documents:
        next(steps)
        yield doc


def _write_all(staged: Staged, workers: int, progress: Progress | None) -> None:
    """Every shard, in ``workers`` processes (or this one for 1), stopping early when a ``max_tokens``
    budget is spent by the shards before (``finish`` cuts the shard that crosses it); the progress
    steps are each finished shard's input bytes."""
    budget = read_plan(staged.path).max_tokens
    records = write_in_order(staged.path, list(range(staged.num_shards)), workers, budget)
    steps = (staged.shard_bytes[r.index] for r in records)
    for _ in progress(steps, sum(staged.shard_bytes) or None) if progress else steps:
        pass


# --- step 3: the dataset ---------------------------------------------------------------------------


def finish(staging: Path, out: Path, *, force: bool = False) -> DatasetMeta:
    """Check the shards, cut at ``max_tokens``, write ``meta.json`` and move the dataset into place:
    the staging folder is renamed to ``out``, replacing an old dataset only then."""
    plan = read_plan(staging)
    if out.exists() or out.is_symlink():  # checked again now: it may have appeared since ``prepare`` began
        if not force:
            raise ConfigError(str(out), "already exists (pass --force to replace it)")
        check_replaceable(out)
    budget = plan.max_tokens
    records: list[ShardRecord] = []
    written = 0
    for i in range(len(plan.shards)):
        if budget is not None and written >= budget:
            _drop_shard(staging, i)
            continue
        record = shard_record(staging, i)
        if record is None:
            raise ConfigError(str(staging), f"shard {i} of {len(plan.shards)} is not written")
        if budget is not None and written + record.num_tokens > budget:
            if record.budget != budget - written:
                record = write_shard(staging, i, budget=budget - written)
            written = budget  # a shard cut to fit: the later documents are not in the dataset
        else:
            written += record.num_tokens
        records.append(record)
    meta = _meta(plan, records, staging)
    if not meta.num_documents:  # max_tokens always leaves room for one (``stage``)
        raise ConfigError("sample", f"kept none of the documents (fraction {plan.sample}, seed {plan.seed})")
    write_json(staging / META_FILE, meta.to_json())
    for i in range(len(plan.shards)):
        (staging / record_name(i)).unlink(missing_ok=True)
    (staging / PLAN_FILE).unlink()
    publish(staging, out)  # a symlink is replaced, not its target
    return meta


def _drop_shard(staging: Path, index: int) -> None:
    for name in (*(shard_file(split, index) for split in SPLITS), record_name(index)):
        (staging / name).unlink(missing_ok=True)


def _meta(plan: PreparePlan, records: list[ShardRecord], staging: Path) -> DatasetMeta:
    """The dataset's metadata: its sources (each input once, in order) and fingerprint."""
    if plan.listed is not None:
        sources, identity = plan.listed, [s["sha256"] for s in plan.listed]
    else:
        sources, identity = _sources(plan, records)
    counts = {split: sum(r.tokens[split] for r in records) for split in SPLITS}
    fields: dict[str, Any] = dict(
        tokenizer=plan.tokenizer,
        vocab_size=plan.vocab_size,
        eos_id=plan.eos_id,
        dtype=plan.dtype,
        tokens=counts,
        tokenizer_sha256=plan.tokenizer_sha256,
        sources=sources,
        num_documents=sum(r.documents for r in records),
        val_fraction=plan.val_fraction,
    )
    # How the corpus was cut: recorded always, in the identity only when used (so a dataset made
    # without them keeps the fingerprint it had before they existed). The shards are not part of
    # the identity: the token stream is the same however it is cut into files.
    selection: dict[str, Any] = dict(max_tokens=plan.max_tokens, sample=plan.sample, seed=plan.seed if plan.sample is not None else None)
    key = {k: v for k, v in fields.items() if k != "sources"} | {"sources": identity, "tokenizer": plan.tokenizer.value}
    key |= {k: v for k, v in selection.items() if v is not None}
    if plan.val_split != "tail":
        key["val_split"] = plan.val_split
    fingerprint = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()
    shards = [ShardMeta(tokens=r.tokens, documents=r.documents, sha256=r.sha256) for r in records]
    return DatasetMeta(**fields, fingerprint=fingerprint, **selection, tokenizer_version=plan.tokenizer_version,
                       val_split=plan.val_split, shards=shards)


def _sources(plan: PreparePlan, records: list[ShardRecord]) -> tuple[list[dict[str, Any]], list[str]]:
    """Every input once (a dataset cut into row ranges: its parts merged), described and identified.
    Inputs of shards past a ``max_tokens`` cut are described unread (0 documents), as before shards."""
    described: list[dict[str, Any]] = []
    identities: list[list[str]] = []
    by_input: dict[str, int] = {}
    for i, recipes in enumerate(plan.shards):
        record = records[i] if i < len(records) else None
        for j, recipe in enumerate(recipes):
            if record is not None:
                entry, identity = record.sources[j], record.identity[j]
            else:
                unread = from_recipe(recipe)
                entry, identity = unread.describe(), unread.identity()
            name = recipe.get("path") or recipe["name"]
            if recipe["format"] == "hf-dataset" and name in by_input:
                merged = described[by_input[name]]
                merged["documents"] += entry["documents"]
                identities[by_input[name]].append(identity)
                continue
            by_input[name] = len(described)
            described.append(dict(entry))
            identities.append([identity])
    keys = [ids[0] if len(ids) == 1 else combine_hashes(ids) for ids in identities]
    for entry, ids, key in zip(described, identities, keys, strict=True):
        if len(ids) > 1:  # a dataset read in row ranges: described whole, as if read in one piece
            entry["sha256"] = key
            entry.pop("rows")
    return described, keys


# --- helpers ---------------------------------------------------------------------------------------


def _library_version(kind: TokenizerKind) -> str:
    """The package that does the tokenizing, with its version (recorded, not part of the identity:
    the tokenizer's own fingerprint is)."""
    from importlib import metadata

    package = {TokenizerKind.CL100K_BASE: "tiktoken", TokenizerKind.BPE: "tokenizers"}.get(kind, "diffsweep")
    try:
        return f"{package} {metadata.version(package)}"
    except metadata.PackageNotFoundError:
        return package


def _check_writable(out: Path) -> None:
    if not os.access(out.parent, os.W_OK):
        raise ConfigError(str(out), f"cannot write in {out.parent}")
