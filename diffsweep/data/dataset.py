"""A prepared token dataset: its token shards ``train-00000.bin`` ... / ``val-00000.bin`` ... (flat
token arrays, memory-mapped, read in order as one stream per split) and ``meta.json`` (tokenizer,
vocabulary, token counts per shard with their sha256, sources and their checksums), and the
deterministic sampling the trainer uses. A dataset made before shards (``train.bin`` /
``val.bin``, no ``shards`` in meta.json) opens as one shard.

Batches are a pure function of ``(seed, step)``: the loader has no state beyond the step, so a
resumed run reads exactly what the uninterrupted run would have read.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Any

import numpy as np

from diffsweep.config import ConfigError, TokenizerKind
from diffsweep.config.decode import AtLeast, Check, decode

FORMAT = "diffsweep-tokens/1"
META_FILE = "meta.json"
SPLITS = ("train", "val")
VAL_SPLITS = ("tail", "document")  # how --val-split cuts the documents (see ``prepare``)
# Every name ``data prepare`` leaves in a dataset folder: --force replaces a folder of these only.
WRITTEN = re.compile(r"meta\.json|tokenizer\.json|(train|val)(-\d{5})?\.bin")


def _per_split(what: str, valid) -> Check:
    """A ``{"train": x, "val": y}`` mapping whose two values pass ``valid``."""
    def check(value: Any, key: str) -> dict:
        if not isinstance(value, dict) or set(value) != set(SPLITS) or not all(valid(value[s]) for s in SPLITS):
            raise ConfigError(key, f"expected train and val {what}, got {value!r}")
        return dict(value)
    return Check(check)


def _one_of(options: tuple[str, ...]) -> Check:
    def check(value: Any, key: str) -> str:
        if value not in options:
            raise ConfigError(key, f"expected one of {', '.join(options)}, got {value!r}")
        return value
    return Check(check)


def _fraction(one_allowed: bool) -> Check:
    """A finite number in (0, 1), or in (0, 1] when ``one_allowed``."""
    def check(value: Any, key: str) -> float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        if not ok or not (0 < value <= 1 if one_allowed else 0 < value < 1):
            raise ConfigError(key, f"expected a value in (0, 1{']' if one_allowed else ')'}, got {value!r}")
        return float(value)
    return Check(check)


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


Count = Annotated[int, AtLeast(0)]
TokenCounts = Annotated[dict[str, int], _per_split("token counts", _is_count)]


@dataclass(frozen=True)
class ShardMeta:
    """One shard's entry in ``meta.json``: its token counts, documents and file checksums per split
    (``documents`` and ``sha256`` absent in datasets written before they were recorded)."""

    tokens: TokenCounts
    documents: Count | None = None
    sha256: Annotated[dict[str, str], _per_split("sha256 strings", lambda v: isinstance(v, str))] | None = None

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass(frozen=True)
class DatasetMeta:
    """What ``meta.json`` records about a prepared dataset (decoded strictly by ``read_meta``)."""

    tokenizer: TokenizerKind
    vocab_size: Annotated[int, AtLeast(1)]
    eos_id: int | None
    # numpy dtype of the token files: uint16 when the vocabulary fits, else uint32
    dtype: Annotated[str, _one_of(("uint16", "uint32"))]
    tokens: TokenCounts  # split -> number of tokens
    tokenizer_sha256: str
    # [{"path", "sha256", "bytes", "format", "documents"}] of every input file, or a Hugging Face
    # dataset's {"dataset", "config", "split", "fingerprint", "sha256" (of its texts), "documents"}
    sources: list[dict[str, Any]]
    num_documents: Count
    val_fraction: Annotated[float, _fraction(one_allowed=False)]
    fingerprint: str  # sha256 over everything (sources by content; the three below when set): its identity
    max_tokens: Annotated[int, AtLeast(1)] | None = None  # --max-tokens: writing stopped at this many tokens
    sample: Annotated[float, _fraction(one_allowed=True)] | None = None  # --sample: the fraction of documents kept ...
    seed: int | None = None  # ... by this seed (None without --sample)
    tokenizer_version: str | None = None  # the library that tokenized it and its version ("tiktoken 0.9.0")
    # tail: the end of every document is validation; document: whole documents
    val_split: Annotated[str, _one_of(VAL_SPLITS)] = "tail"
    # per shard, in order (None: a dataset from before shards, one train.bin / val.bin)
    shards: list[ShardMeta] | None = None

    def to_json(self) -> dict[str, Any]:
        fields = {k: (v.value if k == "tokenizer" else v) for k, v in self.__dict__.items()}
        if self.shards is not None:
            fields["shards"] = [s.to_json() for s in self.shards]
        return {"format": FORMAT, **fields}


def shard_file(split: str, index: int) -> str:
    return f"{split}-{index:05d}.bin"


def token_files(meta: DatasetMeta) -> dict[str, list[tuple[str, int]]]:
    """Each split's files in order, with their token counts."""
    if meta.shards is None:
        return {split: [(f"{split}.bin", meta.tokens[split])] for split in SPLITS}
    return {split: [(shard_file(split, i), s.tokens[split]) for i, s in enumerate(meta.shards)]
            for split in SPLITS}


class ShardedTokens:
    """Several memory-mapped token files read as one 1-D array: ``len``, integer and slice indexing
    (a slice may span files), ``np.asarray`` (copies the whole split into memory)."""

    def __init__(self, parts: list[np.ndarray]) -> None:
        self._parts = [p for p in parts if len(p)]
        self._ends = np.cumsum([len(p) for p in self._parts])
        self.dtype = parts[0].dtype
        self.shape = (int(self._ends[-1]) if len(self._ends) else 0,)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, key: int | slice) -> Any:
        if isinstance(key, slice):
            start, stop, step = key.indices(len(self))
            if step != 1:
                return np.asarray(self)[key]
            return self._range(start, stop)
        index = int(key) + (len(self) if key < 0 else 0)
        if not 0 <= index < len(self):
            raise IndexError(f"index {key} out of range for {len(self)} tokens")
        part = int(np.searchsorted(self._ends, index, side="right"))
        return self._parts[part][index - (self._ends[part - 1] if part else 0)]

    def _range(self, start: int, stop: int) -> np.ndarray:
        if stop <= start:
            return np.zeros(0, self.dtype)
        first = int(np.searchsorted(self._ends, start, side="right"))
        pieces = []
        while start < stop:
            begin = int(self._ends[first - 1]) if first else 0
            end = min(stop, int(self._ends[first]))
            pieces.append(self._parts[first][start - begin : end - begin])
            start, first = end, first + 1
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        whole = np.concatenate(self._parts) if self._parts else np.zeros(0, self.dtype)
        return whole if dtype is None else whole.astype(dtype)


class TokenDataset:
    """A prepared dataset opened read-only: ``split(name)`` is its 1-D token array (memory-mapped;
    shards read as one array)."""

    def __init__(self, path: Path, meta: DatasetMeta, arrays: dict[str, np.ndarray | ShardedTokens]) -> None:
        self.path, self.meta, self._arrays = path, meta, arrays

    def split(self, name: str) -> Any:
        return self._arrays[name]


def open_dataset(path: str | Path, key: str = "data.path") -> TokenDataset:
    """Open and check a dataset made by ``diffsweep data prepare``; errors name ``key`` and the file."""
    path = Path(path)
    meta_path = path / META_FILE
    if not path.is_dir():
        raise ConfigError(key, f"{path} does not exist (make it with `diffsweep data prepare`)")
    if not meta_path.is_file():
        raise ConfigError(key, f"{meta_path} is missing: {path} is not a dataset made by `diffsweep data prepare`")
    meta = read_meta(meta_path)
    arrays: dict[str, np.ndarray | ShardedTokens] = {}
    for name, files in token_files(meta).items():
        parts = []
        for file_name, count in files:
            file = path / file_name
            expected = count * np.dtype(meta.dtype).itemsize
            if not file.is_file() or file.stat().st_size != expected:
                found = file.stat().st_size if file.is_file() else "no file"
                raise ConfigError(key, f"{file}: expected {expected} bytes ({count} tokens), found {found}")
            parts.append(np.memmap(file, dtype=meta.dtype, mode="r") if expected else np.zeros(0, meta.dtype))
        arrays[name] = parts[0] if len(parts) == 1 else ShardedTokens(parts)
    return TokenDataset(path, meta, arrays)


def check_replaceable(path: Path) -> None:
    """What ``--force`` may replace: a folder ``data prepare`` wrote, its ``meta.json`` a valid
    dataset metadata file, holding nothing else than what ``data prepare`` writes. Anything else is a
    ``ConfigError`` naming it: a user's folder or file is never deleted."""
    why = None
    if not path.is_dir():
        why = "it is not a folder"
    elif not (path / META_FILE).is_file():
        why = f"it has no {META_FILE}"
    else:
        try:
            read_meta(path / META_FILE)
        except ConfigError as exc:
            why = f"{exc}"
        else:
            foreign = sorted(p.name for p in path.iterdir()
                             if not WRITTEN.fullmatch(p.name) or p.is_symlink() or not p.is_file())
            if foreign:
                why = f"it holds {foreign[0]!r}, which `data prepare` does not write"
    if why is not None:
        raise ConfigError(str(path), f"--force replaces only a dataset made by `diffsweep data prepare`, and {why}; "
                          "move it away yourself or choose another --out (nothing was deleted)")


def read_meta(meta_path: Path) -> DatasetMeta:
    """The dataset metadata in ``meta_path``, every field checked (the file may have been edited or
    damaged): a ``ConfigError`` keyed by the file, naming the field, otherwise."""
    try:
        raw = json.loads(meta_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(str(meta_path), f"not a valid dataset metadata file ({exc})") from None
    if not isinstance(raw, dict):
        raise ConfigError(str(meta_path), f"not a valid dataset metadata file (expected a JSON object, got "
                                          f"{type(raw).__name__})")
    if raw.get("format") != FORMAT:  # first: a file of another version is that, not its fields
        raise ConfigError(str(meta_path), f"not a valid dataset metadata file (format is not {FORMAT!r})")
    try:
        meta = decode(DatasetMeta, {k: v for k, v in raw.items() if k != "format"}, source=str(meta_path))
    except ConfigError as exc:  # keyed "FILE: field": the file is the key, the field in the message
        raise ConfigError(str(meta_path), f"not a valid dataset metadata file "
                          f"({exc.key.removeprefix(f'{meta_path}: ')}: {exc.message})") from None
    # What the types cannot say: checks across fields.
    problem = None
    if meta.eos_id is not None and not 0 <= meta.eos_id < meta.vocab_size:
        problem = f"eos_id: expected a token id below vocab_size {meta.vocab_size}, got {meta.eos_id!r}"
    elif meta.shards is not None and not meta.shards:
        problem = "shards: expected a list of shards, got []"
    elif meta.shards is not None:
        for name in SPLITS:
            if sum(s.tokens[name] for s in meta.shards) != meta.tokens[name]:
                problem = f"tokens.{name}: {meta.tokens[name]} is not the sum of its shards' tokens"
    if problem is not None:
        raise ConfigError(str(meta_path), f"not a valid dataset metadata file ({problem})")
    return meta


def check_compatible(meta: DatasetMeta, tokenizer: TokenizerKind, vocab_size: int, seq_len: int) -> None:
    """Raise ``ConfigError`` when the dataset cannot feed a model of this config."""
    if meta.tokenizer is not tokenizer:
        raise ConfigError(
            "data.tokenizer",
            f"the config says {tokenizer.value!r} but the dataset was tokenized with {meta.tokenizer.value!r}",
        )
    if meta.vocab_size > vocab_size:
        raise ConfigError(
            "model.vocab_size",
            f"{vocab_size} is smaller than the dataset's vocabulary ({meta.vocab_size}, {meta.tokenizer.value})",
        )
    for name in SPLITS:
        if meta.tokens[name] < seq_len + 1:
            raise ConfigError(
                "train.seq_len",
                f"the dataset's {name} split has {meta.tokens[name]} tokens, fewer than seq_len + 1 = {seq_len + 1}",
            )


def batch_starts(seed: int, step: int, num_sequences: int, num_tokens: int, seq_len: int) -> np.ndarray:
    """Start offsets of the ``num_sequences`` training windows of ``step`` (uniform, with
    replacement): a pure function of ``(seed, step)``, so data position = step."""
    rng = np.random.default_rng([seed, step])
    return rng.integers(0, num_tokens - seq_len, size=num_sequences)  # window needs seq_len + 1 tokens


def windows(tokens: np.ndarray, starts: np.ndarray, seq_len: int) -> np.ndarray:
    """``(len(starts), seq_len + 1)`` int64 windows: inputs are ``[:, :-1]``, targets ``[:, 1:]``."""
    return np.stack([np.asarray(tokens[s : s + seq_len + 1], dtype=np.int64) for s in starts])


def val_starts(num_tokens: int, seq_len: int, max_tokens: int) -> np.ndarray:
    """Non-overlapping validation windows from the start of the split, at most ``max_tokens``
    predicted tokens (at least one window): the same every evaluation."""
    available = (num_tokens - 1) // seq_len
    count = max(1, min(available, max_tokens // seq_len))
    return np.arange(count) * seq_len
