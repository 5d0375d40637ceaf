"""``diffsweep data prepare``: tokenize documents into a dataset directory (see ``dataset``).

Each document is tokenized; its last ``val_fraction`` of tokens go to the validation split and
the rest to training (so both splits sample every document), each part followed by the
tokenizer's end-of-document token when it has one. The directory is built beside its destination and renamed into
place at the end: an interrupted or failed prepare leaves nothing behind and clobbers nothing, not
even the parent folders it created for the destination.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from diffsweep.config import ConfigError, TokenizerKind
from diffsweep.data.dataset import META_FILE, SPLITS, DatasetMeta
from diffsweep.data.tokenizers import new_tokenizer
from diffsweep.fsutil import parents_made_for

TEXT_SUFFIXES = (".txt", ".md", ".rst")  # what a directory given to ``prepare`` contributes


@dataclass(frozen=True)
class Document:
    """One text to tokenize, and the file it came from (for the dataset's source checksums)."""

    name: str
    text: str
    source: Path


def text_files(paths: Sequence[Path]) -> list[Path]:
    """The files ``paths`` name: files as given, directories searched for ``TEXT_SUFFIXES``."""
    if not paths:
        raise ConfigError("INPUTS", "no text files or directories given")
    files: list[Path] = []
    for path in paths:
        if path.is_file():
            files.append(path)
        elif path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in TEXT_SUFFIXES)
            if not found:
                raise ConfigError(str(path), f"no {'/'.join(TEXT_SUFFIXES)} files in this directory")
            files.extend(found)
        else:
            raise ConfigError(str(path), "no such file or directory")
    return files


def read_documents(files: Sequence[Path]) -> list[Document]:
    """Each file is one document (UTF-8)."""
    documents = []
    for file in files:
        try:
            documents.append(Document(name=str(file), text=file.read_text(encoding="utf-8"), source=file))
        except UnicodeDecodeError as exc:
            raise ConfigError(str(file), f"not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    return documents


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def prepare(
    documents: Sequence[Document],
    out: Path,
    tokenizer: TokenizerKind,
    *,
    vocab_size: int = 4096,
    val_fraction: float = 0.05,
    force: bool = False,
    progress: Callable[[Iterable[Document], int], Iterable[Document]] | None = None,
) -> DatasetMeta:
    """Tokenize ``documents`` into the dataset directory ``out`` and return its metadata.

    ``vocab_size`` only applies to ``bpe`` (trained here on the documents). ``progress`` wraps
    the document iteration (given the total number of characters) to show a progress bar.
    """
    if not documents:
        raise ConfigError("INPUTS", "no documents to tokenize")
    for doc in documents:  # an empty file would still make a dataset: of end-of-document tokens only
        if not doc.text.strip():
            raise ConfigError(doc.name, "no text (empty or only whitespace)")
    if not 0.0 < val_fraction < 1.0:
        raise ConfigError("val_fraction", f"expected a value in (0, 1), got {val_fraction}")
    if out.exists() and not force:
        raise ConfigError(str(out), "already exists (pass --force to replace it)")

    tok = new_tokenizer(tokenizer, lambda: (d.text for d in documents), vocab_size)
    dtype = np.uint16 if tok.vocab_size <= 1 << 16 else np.uint32
    try:
        with parents_made_for(out):
            return _write(documents, out, tok, dtype, val_fraction, progress)
    except OSError as exc:
        raise ConfigError(str(out), f"cannot write it ({exc.strerror or exc})") from None


def _write(documents, out, tok, dtype, val_fraction, progress) -> DatasetMeta:
    """Tokenize into a staging folder beside ``out`` and rename it into place."""
    if not os.access(out.parent, os.W_OK):
        raise ConfigError(str(out), f"cannot write in {out.parent}")
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        counts = {name: 0 for name in SPLITS}
        files = {name: open(staging / f"{name}.bin", "wb") for name in SPLITS}
        try:
            total_chars = sum(len(d.text) for d in documents)
            for doc in progress(documents, total_chars) if progress else documents:
                ids = tok.encode(doc.text)
                num_val = int(round(len(ids) * val_fraction))
                eos = [tok.eos_id] if tok.eos_id is not None else []
                # Both parts end with eos, so both splits show the model document boundaries.
                parts = {"train": ids[: len(ids) - num_val] + eos, "val": ids[len(ids) - num_val :] + eos}
                for name in SPLITS:
                    files[name].write(np.asarray(parts[name], dtype=dtype).tobytes())
                    counts[name] += len(parts[name])
        finally:
            for f in files.values():
                f.flush()
                os.fsync(f.fileno())
                f.close()
        sources = sorted({d.source for d in documents})
        meta = _meta(tok, dtype, counts, sources, len(documents), val_fraction)
        tok.save(staging)
        (staging / META_FILE).write_text(json.dumps(meta.to_json(), indent=2) + "\n")
        _replace_dir(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return meta


def _meta(tok, dtype, counts, sources, num_documents, val_fraction) -> DatasetMeta:
    fields = dict(
        tokenizer=tok.kind,
        vocab_size=tok.vocab_size,
        eos_id=tok.eos_id,
        dtype=np.dtype(dtype).name,
        tokens=counts,
        tokenizer_sha256=tok.fingerprint(),
        sources=[{"path": str(p), "sha256": sha256_file(p), "bytes": p.stat().st_size} for p in sources],
        num_documents=num_documents,
        val_fraction=val_fraction,
    )
    identity = {k: v for k, v in fields.items() if k != "sources"} | {"sources": [s["sha256"] for s in fields["sources"]]}
    identity["tokenizer"] = tok.kind.value
    fingerprint = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()
    return DatasetMeta(**fields, fingerprint=fingerprint)


def _replace_dir(staging: Path, out: Path) -> None:
    """Move the finished ``staging`` directory to ``out``, replacing an old one only at the end."""
    if out.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old.", dir=out.parent))
        os.replace(out, old / out.name)
        os.replace(staging, out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(staging, out)
