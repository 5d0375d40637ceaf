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
import hashlib
import json
import multiprocessing
import os
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

import numpy as np

from diffsweep.config import ConfigError, EnvironmentUnavailable, TokenizerKind
from diffsweep.data.dataset import SPLITS, shard_file
from diffsweep.data.sources import Document, from_recipe, keep
from diffsweep.data.tokenizers import Tokenizer, load_tokenizer
from diffsweep.fsutil import write_atomically

PLAN_FILE = "plan.json"
PLAN_FORMAT = "diffsweep-prepare-plan/1"


def read_plan(staging: Path) -> dict[str, Any]:
    """The plan ``stage`` wrote into ``staging`` (a ``ConfigError`` when it is unreadable or not one)."""
    try:
        plan = json.loads((staging / PLAN_FILE).read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(str(staging / PLAN_FILE), f"not a readable prepare plan ({exc})") from exc
    if plan.get("format") != PLAN_FORMAT:
        raise ConfigError(str(staging / PLAN_FILE), f"format is not {PLAN_FORMAT!r}")
    return plan


def write_shards(staging: Path, indices: Iterable[int], workers: int = 1) -> list[dict[str, Any]]:
    """Write the shards ``indices`` not yet done (resumable: a done shard has its record) in up to
    ``workers`` processes (1: this one); returns their records. What a worker process or a Slurm
    array task runs."""
    return list(write_in_order(staging, list(indices), workers))


def shard_record(staging: Path, index: int) -> dict[str, Any] | None:
    """The record of a finished shard (None when it is not done, or its files do not match it)."""
    try:
        record = json.loads((staging / record_name(index)).read_text())
        for split in SPLITS:
            file = staging / shard_file(split, index)
            count, itemsize = record["tokens"][split], record["itemsize"]
            if not (_count(count) and itemsize in (2, 4) and file.is_file() and file.stat().st_size == count * itemsize):
                return None
        if not (_count(record["documents"]) and isinstance(record["sources"], list)
                and isinstance(record["identity"], list) and isinstance(record["sha256"], dict)):
            return None
    except (OSError, ValueError, KeyError, TypeError):  # unreadable or damaged: the shard is written again
        return None
    return record


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def write_shard(staging: Path, index: int, *, budget: int | None = None, documents: Iterable[Document] | None = None,
                on_document: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Tokenize shard ``index`` (its sources from the plan, or ``documents``) and write its files,
    then its record. ``budget``: stop after that many tokens (``max_tokens`` left for this shard)."""
    plan = read_plan(staging)
    tok = _tokenizer(staging, plan)
    sources = [] if documents is not None else [from_recipe(r) for r in plan["shards"][index]]
    if documents is None:
        documents = _sampled(sources, plan["sample"], plan["seed"])
    dtype = np.dtype(plan["dtype"])
    eos = [tok.eos_id] if tok.eos_id is not None else []
    whole_documents = plan["val_split"] == "document"
    eos_per_document = len(eos) * (1 if whole_documents else 2)
    counts = dict.fromkeys(SPLITS, 0)
    digests = {split: hashlib.sha256() for split in SPLITS}
    num_documents = 0
    temp = {split: staging / f".{shard_file(split, index)}.{os.getpid()}" for split in SPLITS}
    try:
        files = {split: open(temp[split], "wb") for split in SPLITS}
        try:
            for doc in documents:
                ids = tok.encode(doc.text)
                if budget is not None:
                    room = budget - sum(counts.values()) - eos_per_document
                    if room < 1:
                        break
                    ids = ids[:room]
                for split, part in _parts(ids, eos, doc.name, plan["val_fraction"], whole_documents):
                    data = np.asarray(part, dtype=dtype).tobytes()
                    files[split].write(data)
                    digests[split].update(data)
                    counts[split] += len(part)
                num_documents += 1
                if on_document is not None:
                    on_document(len(doc.text))
                if budget is not None and sum(counts.values()) >= budget:
                    break
        finally:
            for f in files.values():
                f.flush()
                os.fsync(f.fileno())
                f.close()
        for split in SPLITS:
            os.replace(temp[split], staging / shard_file(split, index))
    except BaseException:
        for path in temp.values():
            path.unlink(missing_ok=True)
        raise
    record = {"index": index, "tokens": counts, "documents": num_documents, "itemsize": dtype.itemsize,
              "sha256": {split: digests[split].hexdigest() for split in SPLITS}, "budget": budget,
              "sources": [s.describe() for s in sources], "identity": [s.identity() for s in sources]}
    write_json(staging / record_name(index), record)
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


def _sampled(sources: list[Any], sample: float | None, seed: int) -> Iterator[Document]:
    for source in sources:
        for doc in source.documents():
            if sample is None or keep(doc.name, sample, seed):
                yield doc


_TOKENIZERS: dict[tuple[str, str], Tokenizer] = {}  # per process: a worker loads it once


def _tokenizer(staging: Path, plan: dict[str, Any]) -> Tokenizer:
    key = (str(staging), plan["tokenizer_sha256"])
    if key not in _TOKENIZERS:
        _TOKENIZERS.clear()
        _TOKENIZERS[key] = load_tokenizer(TokenizerKind(plan["tokenizer"]), staging)
    return _TOKENIZERS[key]


def write_in_order(staging: Path, indices: list[int], workers: int, budget: int | None = None) -> Iterator[dict[str, Any]]:
    """Write the shards ``indices`` (a written one is kept), yielding their records in order; with a
    ``budget`` of tokens, stop once the shards so far hold that many."""
    written = 0
    if workers == 1 or len(indices) == 1:
        for i in indices:
            if budget is not None and written >= budget:
                return
            record = shard_record(staging, i) or write_shard(staging, i, budget=None if budget is None else budget - written)
            written += sum(record["tokens"].values())
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
                written += sum(record["tokens"].values())
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
