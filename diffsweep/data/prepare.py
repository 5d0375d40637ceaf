"""``diffsweep data prepare``: tokenize documents into a dataset directory (see ``dataset``).

The documents come from a list in memory or from a ``sources.Corpus``, read lazily (twice for a
trained ``bpe``: once to train it, once to write), so memory stays bounded by one document.

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
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from diffsweep.config import ConfigError, TokenizerKind
from diffsweep.data.dataset import META_FILE, SPLITS, DatasetMeta
from diffsweep.data.sources import Corpus, Document, sha256_file
from diffsweep.data.tokenizers import new_tokenizer
from diffsweep.fsutil import parents_made_for

__all__ = ["Corpus", "Document", "prepare"]  # Document and Corpus: what prepare takes
Progress = Callable[[Iterable[Document], int | None], Iterable[Document]]


class _Listed:
    """Documents already in memory (the demo corpus, tests), as a ``Corpus``: meta.json lists the
    files they came from (each once, sorted), with sha256 and size."""

    sample: float | None = None
    seed: int = 0

    def __init__(self, documents: Sequence[Document]) -> None:
        if not documents:
            raise ConfigError("INPUTS", "no documents to tokenize")
        for doc in documents:  # an empty file would still make a dataset: of end-of-document tokens only
            if not doc.text.strip():
                raise ConfigError(doc.name, "no text (empty or only whitespace)")
        self._documents = documents
        self.size: int | None = sum(len(d.text) for d in documents)
        self._files = sorted({d.source for d in documents})
        self._described: list[dict[str, Any]] | None = None

    def documents(self) -> Iterator[Document]:
        return iter(self._documents)

    def describe(self) -> list[dict[str, Any]]:
        if self._described is None:
            self._described = [{"path": str(p), "sha256": sha256_file(p), "bytes": p.stat().st_size}
                               for p in self._files]
        return self._described

    def identity(self) -> list[str]:
        return [s["sha256"] for s in self.describe()]


def prepare(
    documents: Sequence[Document] | Corpus,
    out: Path,
    tokenizer: TokenizerKind,
    *,
    vocab_size: int = 4096,
    val_fraction: float = 0.05,
    force: bool = False,
    progress: Progress | None = None,
    max_tokens: int | None = None,
) -> DatasetMeta:
    """Tokenize ``documents`` (a list, or a ``Corpus`` read lazily) into the dataset directory
    ``out`` and return its metadata.

    ``vocab_size`` only applies to ``bpe``, trained here on every document of the corpus (one
    pass, before the pass that writes the tokens). ``max_tokens`` stops writing once that many
    tokens (train + val) are written: the document that crosses it is cut to fit (its first
    tokens, split as any other), so the dataset has exactly ``max_tokens`` tokens unless the room
    left is too small for a token and its two end-of-document tokens (then it is dropped and the
    dataset is 1 or 2 tokens short). ``progress`` wraps the document iteration (given the total
    characters, or for a ``Corpus`` the bytes of its files; None when unknown) to show a progress bar.
    """
    corpus = _Listed(documents) if isinstance(documents, Sequence) else documents
    if not 0.0 < val_fraction < 1.0:
        raise ConfigError("val_fraction", f"expected a value in (0, 1), got {val_fraction}")
    if max_tokens is not None and max_tokens < 1:
        raise ConfigError("max_tokens", f"expected a positive number of tokens, got {max_tokens}")
    if out.exists() and not force:
        raise ConfigError(str(out), "already exists (pass --force to replace it)")

    tok = new_tokenizer(tokenizer, lambda: (d.text for d in corpus.documents()), vocab_size)
    dtype = np.uint16 if tok.vocab_size <= 1 << 16 else np.uint32
    try:
        with parents_made_for(out):
            return _write(corpus, out, tok, dtype, val_fraction, progress, max_tokens)
    except OSError as exc:
        raise ConfigError(str(out), f"cannot write it ({exc.strerror or exc})") from None


def _write(corpus, out, tok, dtype, val_fraction, progress, max_tokens) -> DatasetMeta:
    """Tokenize into a staging folder beside ``out`` and rename it into place."""
    if not os.access(out.parent, os.W_OK):
        raise ConfigError(str(out), f"cannot write in {out.parent}")
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        counts = {name: 0 for name in SPLITS}
        num_documents = 0
        files = {name: open(staging / f"{name}.bin", "wb") for name in SPLITS}
        eos = [tok.eos_id] if tok.eos_id is not None else []
        try:
            documents = corpus.documents()
            for doc in progress(documents, corpus.size) if progress else documents:
                ids = tok.encode(doc.text)
                if max_tokens is not None:
                    room = max_tokens - sum(counts.values()) - 2 * len(eos)
                    if room < 1:
                        break
                    ids = ids[:room]
                num_val = int(round(len(ids) * val_fraction))
                # Both parts end with eos, so both splits show the model document boundaries.
                parts = {"train": ids[: len(ids) - num_val] + eos, "val": ids[len(ids) - num_val :] + eos}
                for name in SPLITS:
                    files[name].write(np.asarray(parts[name], dtype=dtype).tobytes())
                    counts[name] += len(parts[name])
                num_documents += 1
                if max_tokens is not None and sum(counts.values()) >= max_tokens:
                    break
        finally:
            for f in files.values():
                f.flush()
                os.fsync(f.fileno())
                f.close()
        meta = _meta(tok, dtype, counts, corpus, num_documents, val_fraction, max_tokens)
        tok.save(staging)
        (staging / META_FILE).write_text(json.dumps(meta.to_json(), indent=2) + "\n")
        _replace_dir(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return meta


def _meta(tok, dtype, counts, corpus, num_documents, val_fraction, max_tokens) -> DatasetMeta:
    fields = dict(
        tokenizer=tok.kind,
        vocab_size=tok.vocab_size,
        eos_id=tok.eos_id,
        dtype=np.dtype(dtype).name,
        tokens=counts,
        tokenizer_sha256=tok.fingerprint(),
        sources=corpus.describe(),
        num_documents=num_documents,
        val_fraction=val_fraction,
    )
    # How the corpus was cut: recorded always, in the identity only when used (so a dataset made
    # without them keeps the fingerprint it had before they existed).
    selection = dict(max_tokens=max_tokens, sample=corpus.sample,
                     seed=corpus.seed if corpus.sample is not None else None)
    identity = {k: v for k, v in fields.items() if k != "sources"} | {"sources": corpus.identity()}
    identity |= {k: v for k, v in selection.items() if v is not None}
    identity["tokenizer"] = tok.kind.value
    fingerprint = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()
    return DatasetMeta(**fields, fingerprint=fingerprint, **selection)


def _replace_dir(staging: Path, out: Path) -> None:
    """Move the finished ``staging`` directory to ``out``, replacing an old one only at the end."""
    if out.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old.", dir=out.parent))
        os.replace(out, old / out.name)
        os.replace(staging, out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(staging, out)
