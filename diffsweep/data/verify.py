"""``diffsweep data verify``: re-read a prepared dataset's token files and check them against
``meta.json``, in bounded memory (``CHUNK_TOKENS`` at a time).

Checked per file: its size is its token count (a wrong size is the one problem reported for that
file: nothing else in it can be trusted); its sha256 is the one recorded (datasets from before
shards record none); every token id is below ``vocab_size``. With an end-of-document token (not
``bytes``), what ``prepare`` guarantees about it: a nonempty file ends with it, and each shard
holds exactly one per document and split part, since every part written ends with one and no
tokenizer emits it from text (``encode`` treats special tokens in text as plain text). With
``--val-split tail`` every document writes a part to both splits, so both files of a shard hold
``documents`` of them; with ``document`` a document goes to one split, so the two files together
hold ``documents``. Nothing is assumed about adjacent end-of-document tokens: an empty part is
legitimate (a short document's validation tail rounds to zero tokens, or, with a large
``--val-fraction``, its training head does).

Problems that make the files unusable are reported, never raised: a truncated shard is damage
(exit 1), whereas a path that is not a dataset, or an unreadable ``meta.json``, is a
``ConfigError`` (exit 2), as for ``open_dataset``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from diffsweep.config import ConfigError, EnvironmentUnavailable
from diffsweep.data.dataset import META_FILE, SPLITS, DatasetMeta, read_meta, token_files

CHUNK_TOKENS = 16 * 2**20  # tokens read at once: 32-64 MiB of buffer, whatever the dataset's size


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the dataset, in ``file`` (a name inside the dataset directory)."""

    file: str
    message: str

    def __str__(self) -> str:
        return f"{self.file}: {self.message}"


@dataclass(frozen=True)
class FileCheck:
    """What was read from one token file."""

    name: str
    split: str
    tokens: int  # as meta.json records them
    checksum: bool  # whether meta.json records a sha256 to compare with
    eos: int | None = None  # end-of-document tokens found (None: not counted)


@dataclass(frozen=True)
class ShardCheck:
    """One shard (a dataset from before shards: its train.bin / val.bin as shard 0)."""

    index: int
    files: list[FileCheck]
    documents: int | None
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclass(frozen=True)
class VerifyReport:
    """The result of ``verify_dataset``: every shard checked, and what could not be checked."""

    path: Path
    meta: DatasetMeta
    shards: list[ShardCheck]
    problems: list[Problem]  # every shard's problems and the dataset's own, in order
    notes: list[str]  # checks not made, and why

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        return {
            "path": str(self.path), "ok": self.ok, "num_shards": len(self.shards), "tokens": self.meta.tokens,
            "num_documents": self.meta.num_documents,
            "shards": [{"index": s.index, "ok": s.ok, "documents": s.documents,
                        "files": {f.split: {"name": f.name, "tokens": f.tokens, "sha256_checked": f.checksum,
                                            "eos": f.eos} for f in s.files},
                        "problems": [str(p) for p in s.problems]} for s in self.shards],
            "problems": [{"file": p.file, "message": p.message} for p in self.problems],
            "notes": self.notes,
        }


def verify_dataset(path: str | Path, *, chunk_tokens: int = CHUNK_TOKENS,
                   on_shard: Callable[[ShardCheck], None] | None = None,
                   check_tokenizer: Callable[[DatasetMeta, Path], Problem | str | None] | None = None) -> VerifyReport:
    """Check every token file of the dataset at ``path`` (see the module docstring).

    Raises ``ConfigError`` (naming ``path`` or its meta.json) when ``path`` is not a dataset;
    everything wrong with its token files is in the report. ``on_shard`` is called with each shard's
    check as soon as it is made (a progress line for a large dataset). ``check_tokenizer`` (default:
    ``tokenizer_problem``) checks the saved tokenizer: a ``Problem``, a note (a ``str``: not
    checked), or None when it is fine.
    """
    path = Path(path)
    if not path.is_dir():
        raise ConfigError(str(path), "does not exist (make it with `diffsweep data prepare`)")
    meta_path = path / META_FILE
    if not meta_path.is_file():
        raise ConfigError(str(path), f"{META_FILE} is missing: not a dataset made by `diffsweep data prepare`")
    meta = read_meta(meta_path)
    notes = []
    if meta.shards is None:
        notes.append("no checksum recorded (a dataset from before shards): sha256 not checked")
    if meta.eos_id is None:
        notes.append(f"the {meta.tokenizer.value} tokenizer has no end-of-document token: document structure "
                     "not checked")
    shards = []
    for i, files in enumerate(_shard_files(meta)):
        shards.append(_check_shard(path, meta, i, files, chunk_tokens))
        if on_shard is not None:
            on_shard(shards[-1])
    problems = [p for s in shards for p in s.problems]
    result = (check_tokenizer or tokenizer_problem)(meta, path)
    if isinstance(result, Problem):
        problems.append(result)
    elif result is not None:
        notes.append(result)
    return VerifyReport(path, meta, shards, problems, notes)


def tokenizer_problem(meta: DatasetMeta, path: Path) -> Problem | str | None:
    """Whether the tokenizer the dataset loads with is the one it was made with (its fingerprint):
    a damaged ``tokenizer.json`` of a ``bpe`` dataset decodes to the wrong text."""
    from diffsweep.data.tokenizers import BPE_FILE, load_tokenizer

    try:
        tok = load_tokenizer(meta.tokenizer, path)
    except ConfigError as exc:
        return Problem(Path(exc.key).name, exc.message)  # the tokenizer file, missing or unreadable
    except EnvironmentUnavailable as exc:
        return f"tokenizer not checked ({exc})"
    if tok.fingerprint() != meta.tokenizer_sha256:
        saved = BPE_FILE if (path / BPE_FILE).exists() else f"the {meta.tokenizer.value} tokenizer"
        return Problem(saved, "its fingerprint is not the tokenizer_sha256 in meta.json (a different or "
                              "damaged tokenizer)")
    return None


def _shard_files(meta: DatasetMeta) -> list[list[tuple[str, str, int]]]:
    """[(split, file name, tokens)] per shard."""
    files = token_files(meta)
    return [[(split, *files[split][i]) for split in SPLITS] for i in range(len(files[SPLITS[0]]))]


def _check_shard(path: Path, meta: DatasetMeta, index: int, files: list[tuple[str, str, int]],
                 chunk_tokens: int) -> ShardCheck:
    record = meta.shards[index] if meta.shards is not None else None
    documents = record.documents if record is not None else meta.num_documents
    digests = (record.sha256 if record is not None else None) or {}
    problems: list[Problem] = []
    checks = []
    for split, name, count in files:
        expected = digests.get(split)
        check, found = _check_file(path / name, split, count, expected, meta, chunk_tokens)
        checks.append(check)
        problems += found
    problems += _eos_counts(meta, checks, documents)
    return ShardCheck(index, checks, documents, problems)


def _check_file(file: Path, split: str, count: int, sha256: str | None, meta: DatasetMeta,
                chunk_tokens: int) -> tuple[FileCheck, list[Problem]]:
    dtype = np.dtype(meta.dtype)
    expected_bytes = count * dtype.itemsize
    unread = FileCheck(file.name, split, count, sha256 is not None)
    if not file.is_file():
        return unread, [Problem(file.name, f"missing ({count:,} tokens expected)")]
    size = file.stat().st_size
    if size != expected_bytes:
        return unread, [Problem(file.name, f"{size:,} bytes, expected {expected_bytes:,} ({count:,} tokens of "
                                           f"{meta.dtype}): truncated or overwritten")]
    try:
        scan = _scan(file, dtype, meta.vocab_size, meta.eos_id, chunk_tokens)
    except OSError as exc:
        return unread, [Problem(file.name, f"cannot read it ({exc.strerror or exc})")]
    problems = []
    if sha256 is not None and scan.sha256 != sha256:
        problems.append(Problem(file.name, f"sha256 {scan.sha256[:16]}... is not the {sha256[:16]}... recorded "
                                           "in meta.json: its bytes changed"))
    if scan.out_of_range:
        problems.append(Problem(file.name, f"{scan.out_of_range:,} token id{'s' if scan.out_of_range != 1 else ''} >= vocab_size {meta.vocab_size} "
                                           f"(first: {scan.first_bad_id} at token {scan.first_bad_at:,})"))
    if meta.eos_id is not None and count and scan.last != meta.eos_id:
        problems.append(Problem(file.name, f"does not end with the end-of-document token {meta.eos_id} "
                                           f"(last token: {scan.last})"))
    return FileCheck(file.name, split, count, sha256 is not None, scan.eos), problems


@dataclass
class _Scan:
    sha256: str = ""
    eos: int | None = None
    out_of_range: int = 0
    first_bad_at: int | None = None
    first_bad_id: int | None = None
    last: int | None = None


def _scan(file: Path, dtype: np.dtype, vocab_size: int, eos_id: int | None, chunk_tokens: int) -> _Scan:
    """One pass over ``file`` (its size already checked to be whole tokens), ``chunk_tokens`` at a time."""
    digest = hashlib.sha256()
    scan = _Scan(eos=0 if eos_id is not None else None)
    buffer = bytearray(max(1, chunk_tokens) * dtype.itemsize)
    offset = 0
    with open(file, "rb") as f:
        while filled := _fill(f, buffer):
            digest.update(memoryview(buffer)[:filled])
            tokens = np.frombuffer(buffer, dtype, count=filled // dtype.itemsize)
            bad = np.flatnonzero(tokens >= vocab_size)
            if len(bad):
                if scan.first_bad_at is None:
                    scan.first_bad_at, scan.first_bad_id = offset + int(bad[0]), int(tokens[bad[0]])
                scan.out_of_range += len(bad)
            if eos_id is not None:
                scan.eos = (scan.eos or 0) + int(np.count_nonzero(tokens == eos_id))
            scan.last = int(tokens[-1])
            offset += len(tokens)
    scan.sha256 = digest.hexdigest()
    return scan


def _fill(f: Any, buffer: bytearray) -> int:
    """Read into ``buffer`` until it is full or the file ends; the number of bytes read."""
    view, filled = memoryview(buffer), 0
    while filled < len(buffer) and (n := f.readinto(view[filled:])):
        filled += n
    return filled


def _eos_counts(meta: DatasetMeta, checks: list[FileCheck], documents: int | None) -> list[Problem]:
    """One end-of-document token per document and part written (see the module docstring)."""
    counted = [c for c in checks if c.eos is not None]
    if meta.eos_id is None or documents is None or len(counted) != len(checks):
        return []  # no eos, or a file unread (its own problem is reported)
    if meta.val_split == "tail":
        return [Problem(c.name, f"{c.eos:,} end-of-document tokens, expected {documents:,} (one per document "
                                f"of the shard, in both splits)") for c in counted if c.eos != documents]
    if meta.val_split == "document":
        total = sum(c.eos or 0 for c in counted)
        if total != documents:
            names = " + ".join(c.name for c in counted)
            return [Problem(names, f"{total:,} end-of-document tokens, expected {documents:,} (one per document "
                                   "of the shard, in one of the splits)")]
    return []
