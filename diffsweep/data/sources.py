"""Where ``data prepare`` reads its documents: text files, JSONL, Parquet and Hugging Face datasets,
each read lazily (one document at a time), so a pretraining corpus never sits in memory.

Each input becomes one ``Source`` per file (a directory is searched for ``KNOWN_SUFFIXES``,
recursively and sorted) or one per Hugging Face dataset (saved to disk, or a name read from the
local cache only). Rows without text are skipped; a bad row is one ``ConfigError`` keyed ``FILE:ROW``
(rows count from 1; a JSONL row is its line number), refused, never replaced; a missing optional
package or an uncached dataset is ``EnvironmentUnavailable``. A source says what identifies its
content (``identity()``) and is rebuilt in another process from its ``recipe()``; ``plan_shards``
groups the sources into shards; ``keep`` decides ``--sample`` from nothing but a document's name.
See docs/training.md, 'Pretraining corpora'.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from diffsweep.config import ConfigError, EnvironmentUnavailable
from diffsweep.data.compressed import read_lines
from diffsweep.data.errors import json_type, one_line, optional_module
from diffsweep.data.hf_saved import check_saved, is_saved_dataset

TEXT_SUFFIXES = (".txt", ".md", ".rst")  # a whole file is one document
JSONL_SUFFIXES = tuple(f"{base}{z}" for base in (".jsonl", ".ndjson") for z in ("", ".gz", ".zst"))
PARQUET_SUFFIXES = (".parquet",)
KNOWN_SUFFIXES = TEXT_SUFFIXES + JSONL_SUFFIXES + PARQUET_SUFFIXES  # what a directory contributes
BATCH_ROWS = 1024  # rows per Parquet / Hugging Face batch


@dataclass(frozen=True)
class Document:
    """One text to tokenize, its name (``FILE`` or ``FILE:ROW``; errors and ``--sample`` use it),
    and the file or dataset it came from (for the dataset's source checksums)."""

    name: str
    text: str
    source: Path


# --- sources --------------------------------------------------------------------------------------


class Source(ABC):
    """One input of ``data prepare``: ``documents()`` is a fresh lazy pass over its documents."""

    name: str  # the path or dataset name, as errors and meta.json show it
    format: str
    count: int = 0  # documents yielded by the last pass
    given: Path | None = None  # the INPUT path it was found under (a file, or a directory searched)

    @abstractmethod
    def _read(self) -> Iterator[Document]:
        """Every document with text, in order."""

    def documents(self) -> Iterator[Document]:
        """The documents, counted; a source with none (read to its end) is a ``ConfigError``
        (only a whole one: a part of a dataset may hold none)."""
        self.count = 0
        for doc in self._read():
            self.count += 1
            yield doc
        if not self.count and getattr(self, "rows", None) is None:
            raise ConfigError(self.name, "no documents with text")

    @abstractmethod
    def describe(self) -> dict[str, Any]:
        """What meta.json records about this source (after a pass)."""

    @abstractmethod
    def identity(self) -> str:
        """What identifies the content read (after a pass), for the dataset's fingerprint."""

    @property
    def stored_bytes(self) -> int:
        """Bytes it takes on disk (compressed or not; 0 when unknown): how shards are sized."""
        return 0

    @abstractmethod
    def recipe(self) -> dict[str, Any]:
        """Plain JSON from which ``from_recipe`` makes this source again (in a worker, a job)."""


class FileSource(Source):
    """A file: meta.json records its path, sha256 and size (as for text files before)."""

    def __init__(self, path: Path, text_field: str = "text") -> None:
        self.path, self.name, self.text_field = path, str(path), text_field
        self._sha256: str | None = None

    @property
    def stored_bytes(self) -> int:
        return self.path.stat().st_size

    def recipe(self) -> dict[str, Any]:
        return {"format": self.format, "path": str(self.path), "text_field": self.text_field}

    def sha256(self) -> str:
        if self._sha256 is None:
            self._sha256 = sha256_file(self.path)
        return self._sha256

    def describe(self) -> dict[str, Any]:
        entry = {"path": self.name, "sha256": self.sha256(), "bytes": self.path.stat().st_size,
                 "format": self.format, "documents": self.count}
        return entry if self.format == "text" else entry | {"text_field": self.text_field}

    def identity(self) -> str:
        # A text file's identity is its sha256 alone (as before rows existed); a row file's also
        # names the field read from it.
        return self.sha256() if self.format == "text" else f"{self.sha256()}:{self.text_field}"

    def row_text(self, row: int, value: Any, has: Iterable[str]) -> str | None:
        """The text of row ``row`` (its ``text_field``; None when empty), or a ConfigError."""
        key = f"{self.name}:{row}"
        if value is _MISSING:
            raise ConfigError(key, f"no {self.text_field!r} field (it has: {', '.join(has) or 'nothing'})")
        if not isinstance(value, str):
            raise ConfigError(key, f"{self.text_field!r} is not a string (it is {json_type(value)})")
        check_text(key, value)
        return value if value.strip() else None


class TextFile(FileSource):
    format = "text"

    def _read(self) -> Iterator[Document]:
        try:
            text = self.path.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise ConfigError(self.name, f"not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
        if not text.strip():  # an empty file would still make a dataset: of end-of-document tokens only
            raise ConfigError(self.name, "no text (empty or only whitespace)")
        yield Document(name=self.name, text=text, source=self.path)


class JsonlFile(FileSource):
    """One JSON object per line, plain or ``.gz`` / ``.zst`` compressed (streamed)."""

    format = "jsonl"

    def _read(self) -> Iterator[Document]:
        with contextlib.closing(read_lines(self.path)) as lines:  # closed at once when a row is refused
            for row, line in enumerate(lines, start=1):
                text = self._row(row, line)
                if text is not None:
                    yield Document(name=f"{self.name}:{row}", text=text, source=self.path)

    def _row(self, row: int, line: bytes) -> str | None:
        key = f"{self.name}:{row}"
        try:
            decoded = line.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ConfigError(key, f"not UTF-8 text ({exc.reason} at byte {exc.start} of the line)") from exc
        if not decoded.strip():
            return None
        try:
            obj = json.loads(decoded.rstrip("\r\n"))
        except json.JSONDecodeError as exc:
            raise ConfigError(key, f"not a JSON object ({exc.msg.removesuffix(' at')} at column {exc.colno})") from exc
        if not isinstance(obj, dict):
            raise ConfigError(key, f"not a JSON object (it is {json_type(obj)})")
        return self.row_text(row, obj.get(self.text_field, _MISSING), obj)


class ParquetFile(FileSource):
    """A Parquet file's ``text_field`` column, read in batches of rows."""

    format = "parquet"

    def _read(self) -> Iterator[Document]:
        pq = optional_module("pyarrow.parquet", "a Parquet file")
        pa = optional_module("pyarrow", "a Parquet file")
        try:
            parquet = pq.ParquetFile(self.path)
            columns = list(parquet.schema_arrow.names)
            if self.text_field not in columns:
                raise ConfigError(self.name, f"no {self.text_field!r} column (it has: {', '.join(columns)})")
            row = 0
            for batch in parquet.iter_batches(batch_size=BATCH_ROWS, columns=[self.text_field]):
                for value in batch.column(0).to_pylist():
                    row += 1
                    text = self.row_text(row, value, columns)
                    if text is not None:
                        yield Document(name=f"{self.name}:{row}", text=text, source=self.path)
        except (pa.ArrowException, OSError) as exc:
            raise ConfigError(self.name, f"not a readable Parquet file ({one_line(exc)})") from exc


class HfDataset(Source):
    """A Hugging Face dataset: saved to disk (``path``) or in the local cache (``name``)."""

    format = "hf-dataset"

    def __init__(self, name: str, *, path: Path | None, config: str | None, split: str, text_field: str,
                 rows: tuple[int, int] | None = None) -> None:
        self.name, self.path, self.config, self.split, self.text_field = name, path, config, split, text_field
        self.rows = rows  # [first, end) of a saved dataset's rows: one shard's part of it (None: all)
        self.fingerprint: str | None = None
        self._content = 0

    def recipe(self) -> dict[str, Any]:
        return {"format": self.format, "name": self.name, "path": None if self.path is None else str(self.path),
                "config": self.config, "split": self.split, "text_field": self.text_field,
                "rows": None if self.rows is None else list(self.rows)}

    @property
    def stored_bytes(self) -> int:
        if self.path is None:
            return 0
        return sum(p.stat().st_size for p in self.path.rglob("*.arrow"))

    def parts(self, shard_bytes: int) -> list[HfDataset]:
        """This saved dataset cut into row ranges of about ``shard_bytes`` each (in order; itself
        when it is small, or streamed from the cache, whose length is unknown)."""
        if self.path is None or self.stored_bytes <= shard_bytes:
            return [self]
        num_rows = len(self._load())
        per_part = max(1, -(-num_rows * shard_bytes // self.stored_bytes))
        return [HfDataset(self.name, path=self.path, config=self.config, split=self.split,
                          text_field=self.text_field, rows=(first, min(first + per_part, num_rows)))
                for first in range(0, num_rows, per_part)]

    def _load(self) -> Any:
        """The dataset (a ``datasets.Dataset``, or an ``IterableDataset`` when streamed)."""
        datasets = optional_module("datasets", "a Hugging Face dataset")
        if self.path is not None:
            try:
                check_saved(self.path, self.split)
                loaded = datasets.load_from_disk(str(self.path))
            except ConfigError:
                raise
            except Exception as exc:  # noqa: BLE001 (datasets raises many kinds on a damaged folder)
                raise ConfigError(self.name, f"not a readable saved dataset (its state.json, dataset_info.json or "
                                  f".arrow files are damaged: {type(exc).__name__}: {one_line(exc)})") from exc
            if isinstance(loaded, datasets.DatasetDict):
                if self.split not in loaded:
                    raise ConfigError(self.name, f"no split {self.split!r} (it has: {', '.join(loaded)})")
                loaded = loaded[self.split]
            self.fingerprint = getattr(loaded, "_fingerprint", None)
            return loaded
        from diffsweep.data.hf import offline

        where = (f"config {self.config}, " if self.config else "") + f"split {self.split}"
        try:
            with offline():
                return datasets.load_dataset(self.name, self.config, split=self.split, streaming=True)
        except Exception as exc:  # noqa: BLE001 (datasets raises many kinds; all mean "not here")
            raise EnvironmentUnavailable(
                f"{self.name}: not in the local Hugging Face cache ({where}); "
                f"nothing is downloaded at run time: load it once where there is network, with the same HF_HOME "
                f"({one_line(exc)})"
            ) from exc

    def _texts(self, loaded: Any) -> Iterator[tuple[Any, list[str]]]:
        """(value, the row's fields) of every row, in order."""
        columns = list(loaded.column_names or [])
        if self.path is not None:
            if self.text_field not in columns:
                raise ConfigError(self.name, f"no {self.text_field!r} column (it has: {', '.join(columns)})")
            if self.rows is not None:
                loaded = loaded.select(range(*self.rows))
            for batch in loaded.select_columns([self.text_field]).iter(batch_size=BATCH_ROWS):
                for value in batch[self.text_field]:
                    yield value, columns
        else:
            for row in loaded:
                yield row.get(self.text_field, _MISSING), list(row)

    def _read(self) -> Iterator[Document]:
        self._content = 0
        loaded = self._load()
        from diffsweep.data.hf import offline

        with offline() if self.path is None else contextlib.nullcontext():
            first = 1 + (self.rows[0] if self.rows else 0)
            for row, (value, columns) in enumerate(self._texts(loaded), start=first):
                key = f"{self.name}:{row}"
                if value is _MISSING:
                    raise ConfigError(key, f"no {self.text_field!r} field (it has: {', '.join(columns)})")
                if not isinstance(value, str):
                    raise ConfigError(key, f"{self.text_field!r} is not a string (it is {json_type(value)})")
                check_text(key, value)
                if value.strip():
                    self._content = (self._content + row_hash(row, value)) % 2**256
                    yield Document(name=key, text=value, source=Path(self.name))

    def describe(self) -> dict[str, Any]:
        entry = {"dataset": self.name, "format": self.format, "config": self.config, "split": self.split,
                 "text_field": self.text_field, "fingerprint": self.fingerprint, "sha256": self.identity(),
                 "documents": self.count}
        return entry if self.rows is None else entry | {"rows": list(self.rows)}

    def identity(self) -> str:
        return f"{self._content:064x}"  # of the rows read: the same rows give the same dataset


# --- opening inputs -------------------------------------------------------------------------------


def open_sources(inputs: Sequence[str | Path], *, text_field: str = "text", split: str = "train",
                 config: str | None = None) -> list[Source]:
    """The sources of ``data prepare``'s INPUTS (paths or Hugging Face dataset names), in order.

    A path that does not exist is an error unless it looks like a dataset name (see
    ``_looks_like_a_path``). Nothing is read yet beyond directory listings.
    """
    if not inputs:
        raise ConfigError("INPUTS", "no files, directories or datasets given")
    if not text_field:
        raise ConfigError("text_field", "expected a field name")
    sources: list[Source] = []
    for given in inputs:
        path = Path(given)
        if path.is_dir():
            found = _directory(path, text_field, split, config)
        elif path.is_file():
            found = [_file(path, text_field)]
        elif _looks_like_a_path(str(given)):
            raise ConfigError(str(given), "no such file or directory")
        else:
            sources.append(HfDataset(str(given), path=None, config=config, split=split, text_field=text_field))
            continue
        for source in found:
            source.given = path
        sources.extend(found)
    return sources


def _looks_like_a_path(name: str) -> bool:
    """Whether a missing INPUT is a mistyped path rather than a Hugging Face dataset name
    (``name`` or ``owner/name``): a known suffix, a leading ``/``, ``.`` or ``~``, a trailing
    ``/``, more than one ``/``, or a first part that is a local directory."""
    return (name.endswith((*KNOWN_SUFFIXES, "/")) or name.startswith(("/", ".", "~")) or name.count("/") > 1
            or ("/" in name and Path(name.split("/")[0]).is_dir()))


def _file(path: Path, text_field: str) -> Source:
    """A file given by name: by its suffix; an unknown suffix is read as text (as before rows)."""
    if path.name.endswith(JSONL_SUFFIXES):
        return JsonlFile(path, text_field)
    if path.name.endswith(PARQUET_SUFFIXES):
        return ParquetFile(path, text_field)
    return TextFile(path, text_field)


def _directory(path: Path, text_field: str, split: str, config: str | None) -> list[Source]:
    if is_saved_dataset(path):
        return [HfDataset(str(path), path=path, config=config, split=split, text_field=text_field)]
    found = sorted(p for p in path.rglob("*") if p.is_file() and p.name.endswith(KNOWN_SUFFIXES))
    if not found:
        raise ConfigError(str(path), f"no {'/'.join(KNOWN_SUFFIXES)} files in this directory")
    return [_file(p, text_field) for p in found]


def from_recipe(recipe: dict[str, Any]) -> Source:
    """The source a ``Source.recipe()`` describes."""
    kinds: dict[str, type[FileSource]] = {"text": TextFile, "jsonl": JsonlFile, "parquet": ParquetFile}
    if recipe["format"] in kinds:
        return kinds[recipe["format"]](Path(recipe["path"]), recipe["text_field"])
    rows = recipe.get("rows")
    return HfDataset(recipe["name"], path=None if recipe["path"] is None else Path(recipe["path"]),
                     config=recipe["config"], split=recipe["split"], text_field=recipe["text_field"],
                     rows=None if rows is None else (rows[0], rows[1]))


def plan_shards(sources: Sequence[Source], shard_bytes: int) -> list[list[Source]]:
    """The sources in groups of about ``shard_bytes`` on disk, in order: one output shard each.

    Consecutive files are grouped until a group reaches ``shard_bytes``; a bigger file is a shard
    of its own; a saved Hugging Face dataset is cut into row ranges of that size. The groups depend
    on the inputs and ``shard_bytes`` only (not on the number of workers), so the token stream is
    the same whatever runs them.
    """
    if shard_bytes < 1:
        raise ConfigError("shard_size", f"expected a positive size, got {shard_bytes}")
    groups: list[list[Source]] = []
    current: list[Source] = []
    current_bytes = 0
    for source in sources:
        for part in source.parts(shard_bytes) if isinstance(source, HfDataset) else [source]:
            current.append(part)
            current_bytes += part.stored_bytes
            if current_bytes >= shard_bytes:
                groups.append(current)
                current, current_bytes = [], 0
    if current:
        groups.append(current)
    return groups


# --- a corpus: the sources chained, sampled -------------------------------------------------------


class Corpus:
    """The documents of ``sources`` in order, keeping a ``sample`` fraction of them (``seed``)."""

    def __init__(self, sources: Sequence[Source], *, sample: float | None = None, seed: int = 0) -> None:
        if not sources:
            raise ConfigError("INPUTS", "no files, directories or datasets given")
        if sample is not None and not 0.0 < sample <= 1.0:
            raise ConfigError("sample", f"expected a fraction in (0, 1], got {sample}")
        self.sources, self.sample, self.seed = list(sources), sample, seed

    def documents(self) -> Iterator[Document]:
        """A fresh pass over the kept documents (a ``ConfigError`` when none is kept)."""
        kept = 0
        for source in self.sources:
            for doc in source.documents():
                if self.sample is None or keep(doc.name, self.sample, self.seed):
                    kept += 1
                    yield doc
        if not kept:
            raise ConfigError("sample", f"kept none of the documents (fraction {self.sample}, seed {self.seed})")


def check_text(key: str, text: str) -> None:
    """Refuse a text that UTF-8 cannot encode: a lone surrogate (``"\\ud800"`` in JSON decodes to one;
    a file read as UTF-8 never holds one). Refused rather than replaced, the same for every
    tokenizer (``bytes`` and ``bpe`` cannot encode it; ``cl100k_base`` would replace it silently)."""
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ConfigError(key, f"the text holds a lone surrogate {text[exc.start]!a} at character {exc.start} "
                          "(an unpaired \\ud800-\\udfff escape): not text UTF-8 can encode") from None


def row_hash(row: int, text: str) -> int:
    """A dataset row's part of its content hash: the hash of a dataset is the sum of its rows' (mod
    2**256), so a dataset read in row ranges has the hash it has read whole (``combine_hashes``)."""
    data = f"{row}\0".encode() + text.encode("utf-8", errors="surrogatepass")
    return int.from_bytes(hashlib.sha256(data).digest(), "big")


def combine_hashes(parts: Iterable[str]) -> str:
    """The content hash of a dataset from those of its row ranges (see ``row_hash``)."""
    return f"{sum(int(p, 16) for p in parts) % 2**256:064x}"


def keep(name: str, fraction: float, seed: int) -> bool:
    """Whether ``--sample fraction --seed seed`` keeps the document ``name``: a pure function of the three."""
    digest = hashlib.blake2b(f"{seed}\0{name}".encode(errors="surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big") < fraction * 2**64


# --- helpers --------------------------------------------------------------------------------------


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


_MISSING: Any = _Missing()
