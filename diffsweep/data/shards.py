"""Step 2 of ``data prepare`` (see ``prepare``): write the shards of a staging folder, from the plan
``stage`` wrote there (``plan.json``, with the tokenizer beside it).

Shard ``i`` is its sources (from the plan's recipes) read, sampled, tokenized and split between
``train-{i:05d}.bin`` and ``val-{i:05d}.bin``, each written under a temporary name and renamed;
its record ``shard-{i:05d}.json`` (token counts, documents, sources, sha256 of its files) is
written last: a shard with a record is done and is not redone. Shards are written in this process
or in worker processes (``write_in_order``); a Slurm array task runs ``write_shards`` on its own.
``write_json`` is the atomic JSON writer of the staging folder's files and of a launch's record.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import json
import multiprocessing
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import numpy as np

from diffsweep.config import ConfigError, EnvironmentUnavailable, TokenizerKind
from diffsweep.config.decode import Check, format_tag, read_json_record
from diffsweep.data.dataset import SPLITS, shard_file
from diffsweep.data.sources import Document, from_recipe, keep
from diffsweep.data.tokenizers import Tokenizer, load_tokenizer
from diffsweep.fsutil import write_atomically, written_atomically

PLAN_FILE = "plan.json"
PLAN_FORMAT = "diffsweep-prepare-plan/1"


def _number(value: Any, key: str) -> Any:
    """A number kept as written (an int stays an int: the dataset's fingerprint hashes it as JSON)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(key, f"expected a number, got {value!r}")
    return value


@dataclass(frozen=True, kw_only=True)
class PreparePlan:
    """``plan.json``: what ``stage`` decided (the tokenizer, how the corpus is cut and split, each
    shard's sources as recipes) and every shard writer reads."""

    format: Annotated[str, format_tag(PLAN_FORMAT)]
    tokenizer: TokenizerKind
    vocab_size: int
    eos_id: int | None
    tokenizer_sha256: str
    tokenizer_version: str
    dtype: str  # uint16 or uint32
    val_fraction: Annotated[float, Check(_number)]
    val_split: str  # tail or document
    max_tokens: int | None
    sample: Annotated[float, Check(_number)] | None
    seed: int | None
    listed: list[dict[str, Any]] | None  # the documents of a listed corpus, described (one shard); None: sources
    shards: list[list[dict[str, Any]]]  # each shard's sources, as ``Source.recipe()``
    shard_bytes: list[int]  # each shard's input bytes (progress)


@dataclass(frozen=True, kw_only=True)
class ShardRecord:
    """``shard-NNNNN.json``: a written shard (its record is written last: a shard with one is done)."""

    index: int
    tokens: dict[str, int]  # per split
    documents: int
    itemsize: int  # bytes per token in its .bin files
    sha256: dict[str, str]  # per split, of its .bin file
    budget: int | None  # the tokens it was cut to (max_tokens left), None: not cut
    sources: list[dict[str, Any]]  # each source read, described
    identity: list[str]  # each source's identity hash

    @property
    def num_tokens(self) -> int:
        return sum(self.tokens.values())


def read_plan(staging: Path) -> PreparePlan:
    """The plan ``stage`` wrote into ``staging`` (a ``ConfigError`` when it is unreadable or not one)."""
    try:
        return read_json_record(PreparePlan, staging / PLAN_FILE, "prepare plan")
    except FileNotFoundError as exc:
        raise ConfigError(str(staging / PLAN_FILE), f"not a readable prepare plan ({exc.strerror})") from None


def write_plan(staging: Path, plan: PreparePlan) -> None:
    write_json(staging / PLAN_FILE, dataclasses.asdict(plan))


def write_shards(staging: Path, indices: Iterable[int], workers: int = 1) -> list[ShardRecord]:
    """Write the shards ``indices`` not yet done (resumable: a done shard has its record) in up to
    ``workers`` processes (1: this one); returns their records. What a worker process or a Slurm
    array task runs."""
    return list(write_in_order(staging, list(indices), workers))


def shard_record(staging: Path, index: int) -> ShardRecord | None:
    """The record of a finished shard (None when it is not done, or its files do not match it)."""
    try:
        record = read_json_record(ShardRecord, staging / record_name(index), "shard record")
        for split in SPLITS:
            file = staging / shard_file(split, index)
            count, itemsize = record.tokens[split], record.itemsize
            if not (count >= 0 and itemsize in (2, 4) and file.is_file() and file.stat().st_size == count * itemsize):
                return None
    except (OSError, KeyError, ConfigError):  # missing, unreadable or damaged: the shard is written again
        return None
    return record if record.documents >= 0 else None


def write_shard(staging: Path, index: int, *, budget: int | None = None, documents: Iterable[Document] | None = None,
                on_document: Callable[[int], None] | None = None) -> ShardRecord:
    """Tokenize shard ``index`` (its sources from the plan, or ``documents``) and write its files,
    then its record. ``budget``: stop after that many tokens (``max_tokens`` left for this shard)."""
    plan = read_plan(staging)
    tok = _tokenizer(staging, plan)
    sources = [] if documents is not None else [from_recipe(r) for r in plan.shards[index]]
    if documents is None:
        documents = _sampled(sources, plan.sample, plan.seed)
    dtype = np.dtype(plan.dtype)
    eos = [tok.eos_id] if tok.eos_id is not None else []
    whole_documents = plan.val_split == "document"
    eos_per_document = len(eos) * (1 if whole_documents else 2)
    counts = dict.fromkeys(SPLITS, 0)
    digests = {split: hashlib.sha256() for split in SPLITS}
    num_documents = 0
    with written_atomically([staging / shard_file(split, index) for split in SPLITS]) as opened:
        files = dict(zip(SPLITS, opened, strict=True))
        for doc in documents:
            ids = tok.encode(doc.text)
            if budget is not None:
                room = budget - sum(counts.values()) - eos_per_document
                if room < 1:
                    break
                ids = ids[:room]
            for split, part in _parts(ids, eos, doc.name, plan.val_fraction, whole_documents):
                data = np.asarray(part, dtype=dtype).tobytes()
                files[split].write(data)
                digests[split].update(data)
                counts[split] += len(part)
            num_documents += 1
            if on_document is not None:
                on_document(len(doc.text))
            if budget is not None and sum(counts.values()) >= budget:
                break
    record = ShardRecord(index=index, tokens=counts, documents=num_documents, itemsize=dtype.itemsize,
                         sha256={split: digests[split].hexdigest() for split in SPLITS}, budget=budget,
                         sources=[s.describe() for s in sources], identity=[s.identity() for s in sources])
    write_json(staging / record_name(index), dataclasses.asdict(record))
    return record


def _parts(ids: list[int], eos: list[int], name: str, val_fraction: float,
           whole_documents: bool) -> list[tuple[str, list[int]]]:
    """(split, tokens) of one document: both splits (``tail``) or one (``document``), each ending with eos."""
    if whole_documents:
        return [("val" if in_validation(name, val_fraction) else "train", ids + eos)]
    num_val = int(round(len(ids) * val_fraction))
    # Both parts end with eos, so both splits show the model document boundaries.
    return [("train", ids[: len(ids) - num_val] + eos), ("val", ids[len(ids) - num_val :] + eos)]


def in_validation(name: str, fraction: float) -> bool:
    """``--val-split document``: whether the document ``name`` (``FILE:ROW``) is held out. A pure
    function of its name: adding files to a corpus moves no document between the splits."""
    return keep(f"validation\0{name}", fraction, seed=0)


def _sampled(sources: list[Any], sample: float | None, seed: int | None) -> Iterator[Document]:
    for source in sources:
        for doc in source.documents():
            if sample is None or keep(doc.name, sample, seed or 0):
                yield doc


_TOKENIZERS: dict[tuple[str, str], Tokenizer] = {}  # per process: a worker loads it once


def _tokenizer(staging: Path, plan: PreparePlan) -> Tokenizer:
    key = (str(staging), plan.tokenizer_sha256)
    if key not in _TOKENIZERS:
        _TOKENIZERS.clear()
        _TOKENIZERS[key] = load_tokenizer(plan.tokenizer, staging)
    return _TOKENIZERS[key]


def write_in_order(staging: Path, indices: list[int], workers: int, budget: int | None = None) -> Iterator[ShardRecord]:
    """Write the shards ``indices`` (a written one is kept), yielding their records in order; with a
    ``budget`` of tokens, stop once the shards so far hold that many."""
    written = 0
    if workers == 1 or len(indices) == 1:
        for i in indices:
            if budget is not None and written >= budget:
                return
            record = shard_record(staging, i) or write_shard(staging, i, budget=None if budget is None else budget - written)
            written += record.num_tokens
            yield record
        return
    context = multiprocessing.get_context("spawn")  # a forked HF tokenizer may deadlock
    with concurrent.futures.ProcessPoolExecutor(min(workers, len(indices)), mp_context=context) as pool:
        pending: list[concurrent.futures.Future] = []
        todo = iter(indices)
        try:
            while True:
                while len(pending) < 2 * workers and (index := next(todo, None)) is not None:
                    pending.append(pool.submit(write_shards, staging, [index]))
                if not pending:
                    return
                record = pending.pop(0).result()[0]
                written += record.num_tokens
                yield record
                if budget is not None and written >= budget:
                    return  # finish cuts the shard that crossed it; later ones are not needed
        except BrokenProcessPool as exc:
            raise EnvironmentUnavailable(
                "a tokenizing worker process died (killed, or out of memory): run the same command again") from exc
        finally:
            for future in pending:
                future.cancel()


def record_name(index: int) -> str:
    """The file name of shard ``index``'s record in the staging folder."""
    return f"shard-{index:05d}.json"


def write_json(path: Path, data: Any) -> None:
    """Write ``data`` as JSON atomically (a reader sees the old file or the whole new one)."""
    write_atomically(path, json.dumps(data, indent=2) + "\n")
