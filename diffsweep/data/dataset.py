"""A prepared token dataset: ``train.bin`` / ``val.bin`` (flat token arrays, memory-mapped) and
``meta.json`` (tokenizer, vocabulary, token counts, source checksums), and the deterministic
sampling the trainer uses.

Batches are a pure function of ``(seed, step)``: the loader has no state beyond the step, so a
resumed run reads exactly what the uninterrupted run would have read.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from diffsweep.config import ConfigError, TokenizerKind

FORMAT = "diffsweep-tokens/1"
META_FILE = "meta.json"
SPLITS = ("train", "val")


@dataclass(frozen=True)
class DatasetMeta:
    """What ``meta.json`` records about a prepared dataset."""

    tokenizer: TokenizerKind
    vocab_size: int
    eos_id: int | None
    dtype: str  # numpy dtype of the token files: uint16 when the vocabulary fits, else uint32
    tokens: dict[str, int]  # split -> number of tokens
    tokenizer_sha256: str
    # [{"path", "sha256", "bytes", "format", "documents"}] of every input file, or a Hugging Face
    # dataset's {"dataset", "config", "split", "fingerprint", "sha256" (of its texts), "documents"}
    sources: list[dict[str, Any]]
    num_documents: int
    val_fraction: float
    fingerprint: str  # sha256 over everything (sources by content; the three below when set): its identity
    max_tokens: int | None = None  # --max-tokens: writing stopped at this many tokens (train + val)
    sample: float | None = None  # --sample: the fraction of documents kept ...
    seed: int | None = None  # ... by this seed (None without --sample)

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, **{k: (v.value if k == "tokenizer" else v) for k, v in self.__dict__.items()}}


class TokenDataset:
    """A prepared dataset opened read-only: ``split(name)`` is a memory-mapped 1-D token array."""

    def __init__(self, path: Path, meta: DatasetMeta, arrays: dict[str, np.ndarray]) -> None:
        self.path, self.meta, self._arrays = path, meta, arrays

    def split(self, name: str) -> np.ndarray:
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
    arrays = {}
    for name in SPLITS:
        file = path / f"{name}.bin"
        expected = meta.tokens[name] * np.dtype(meta.dtype).itemsize
        if not file.is_file() or file.stat().st_size != expected:
            found = file.stat().st_size if file.is_file() else "no file"
            raise ConfigError(key, f"{file}: expected {expected} bytes ({meta.tokens[name]} tokens), found {found}")
        arrays[name] = np.memmap(file, dtype=meta.dtype, mode="r") if expected else np.zeros(0, meta.dtype)
    return TokenDataset(path, meta, arrays)


def read_meta(meta_path: Path) -> DatasetMeta:
    try:
        raw = json.loads(meta_path.read_text())
        if not isinstance(raw, dict):
            raise ValueError(f"expected a JSON object, got {type(raw).__name__}")
        if raw.pop("format", None) != FORMAT:
            raise ValueError(f"format is not {FORMAT!r}")
        raw["tokenizer"] = TokenizerKind(raw["tokenizer"])
        meta = DatasetMeta(**raw)
        # What open_dataset relies on, checked here so a bad file is one error naming it.
        if meta.dtype not in ("uint16", "uint32"):
            raise ValueError(f"dtype: expected 'uint16' or 'uint32', got {meta.dtype!r}")
        if not isinstance(meta.tokens, dict):
            raise ValueError(f"tokens: expected an object of split -> token count, got {meta.tokens!r}")
        for name in SPLITS:
            count = meta.tokens.get(name)
            if not isinstance(count, int) or isinstance(count, bool) or count < 0:
                raise ValueError(f"tokens.{name}: expected a token count, got {count!r}")
        if not isinstance(meta.vocab_size, int) or meta.vocab_size < 1:
            raise ValueError(f"vocab_size: expected a positive integer, got {meta.vocab_size!r}")
        return meta
    except (ValueError, TypeError, KeyError) as exc:
        raise ConfigError(str(meta_path), f"not a valid dataset metadata file ({exc})") from exc


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
