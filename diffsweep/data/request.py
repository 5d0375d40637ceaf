"""What ``diffsweep data prepare`` is asked (``PrepareRequest``): the inputs or the demo corpus, the
dataset directory, how to tokenize and split, and whether the shards are written here or by a job
array. It checks itself when it is made, before anything is read or written: each problem is a
``ConfigError`` naming the field at fault (the CLI shows its flag), or, where two fields clash,
saying both."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from diffsweep.config import ConfigError, ConfigWarning, TokenizerKind

if TYPE_CHECKING:
    from diffsweep.data.sources import Corpus, Document

DEMO_OUT = Path("data/demo")  # the demo corpus's dataset directory
DEMO_SOURCES = Path("data/sources")  # where ``data fetch-demo`` puts its sources
DEFAULT_VOCAB = 4096  # of a trained bpe
_LAUNCH_ONLY = ("profile", "executor", "tasks", "wait")  # fields that apply only to a job array


@dataclass(frozen=True, kw_only=True)
class PrepareRequest:
    """One ``data prepare``: ``inputs`` (paths or Hugging Face dataset names) or ``demo``."""

    inputs: tuple[str, ...] = ()
    demo: bool = False
    out: Path | None = None  # the dataset directory; None: DEMO_OUT with demo
    tokenizer: TokenizerKind = TokenizerKind.BPE
    vocab_size: int | None = None  # of a trained bpe; None: DEFAULT_VOCAB
    val_fraction: float = 0.05
    val_split: str = "tail"
    text_field: str = "text"
    split: str = "train"  # of a Hugging Face dataset
    hf_config: str | None = None  # the configuration (subset) of a Hugging Face dataset
    max_tokens: int | None = None
    sample: float | None = None
    seed: int = 0
    workers: int | None = None  # tokenizing processes here; None: the cores available
    shard_size: str = "256M"  # input bytes per output shard
    sources: Path = DEMO_SOURCES
    force: bool = False
    launch: bool = False  # write the shards as a job array and return
    profile: str | None = None
    executor: str | None = None
    tasks: int | None = None
    wait: bool = False

    def __post_init__(self) -> None:
        from diffsweep.data.prepare import check_settings

        if self.demo == bool(self.inputs):
            raise ConfigError("", "give either INPUTS or --demo (not both)")
        parse_size(self.shard_size, "shard_size")
        if self.workers is not None and self.workers < 1:
            raise ConfigError("workers", f"expected at least 1 worker, got {self.workers}")
        if self.out is None and not self.demo:
            raise ConfigError("out", "expected a directory for the dataset")
        if not self.launch:
            for name in _LAUNCH_ONLY:
                if getattr(self, name) not in (None, False):
                    raise ConfigError(name, "applies only with --launch")
        elif self.demo:
            raise ConfigError("", "--launch applies to INPUTS, not to --demo")
        elif self.workers is not None:
            raise ConfigError("workers", "does not apply with --launch (use --tasks)")
        if self.vocab_size is not None and self.tokenizer is not TokenizerKind.BPE:
            warnings.warn(ConfigWarning(f"--vocab-size: ignored; only the bpe tokenizer is trained "
                                        f"({self.tokenizer.value} has a fixed vocabulary)"), stacklevel=2)
        if self.demo and (self.sample is not None or self.hf_config is not None):
            raise ConfigError("", "--sample and --config apply to INPUTS, not to --demo")
        check_settings(self.tokenizer, vocab_size=self.vocabulary, val_fraction=self.val_fraction,
                       val_split=self.val_split, max_tokens=self.max_tokens)

    @property
    def dataset_dir(self) -> Path:
        return self.out if self.out is not None else DEMO_OUT

    @property
    def vocabulary(self) -> int:
        return DEFAULT_VOCAB if self.vocab_size is None else self.vocab_size

    def documents(self) -> tuple[list[Document] | Corpus, str]:
        """What to tokenize, and how the command names it ("N documents", "N sources"): the demo's
        documents, or the inputs opened as streams (a corpus larger than memory is fine)."""
        from diffsweep.data.sources import Corpus, open_sources

        if self.demo:
            from diffsweep.data.demo import demo_documents

            documents = demo_documents(self.sources)
            return documents, f"{len(documents)} documents"
        corpus = Corpus(open_sources(list(self.inputs), text_field=self.text_field, split=self.split,
                                     config=self.hf_config), sample=self.sample, seed=self.seed)
        return corpus, f"{len(corpus.sources)} source{'s' if len(corpus.sources) != 1 else ''}"

    @property
    def settings(self) -> dict[str, Any]:
        """The dataset's settings as ``prepare`` and the launched tasks take them."""
        return {"vocab_size": self.vocabulary, "val_fraction": self.val_fraction, "val_split": self.val_split,
                "max_tokens": self.max_tokens, "shard_size": self.shard_bytes}

    @property
    def shard_bytes(self) -> int:
        return parse_size(self.shard_size, "shard_size")


def parse_size(text: str, key: str) -> int:
    """``256M`` -> bytes (suffixes K, M, G, T: powers of 1024); a ``ConfigError`` on ``key`` otherwise."""
    units = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
    number, unit = text.strip().rstrip("Bb"), ""
    if number and number[-1].upper() in units:
        number, unit = number[:-1], number[-1].upper()
    try:
        size = float(number) * units[unit]
    except ValueError:
        size = math.nan
    if not math.isfinite(size):  # also nan and inf, which float() reads
        raise ConfigError(key, f"expected a size such as 256M or 1G, got {text!r}")
    if size < 1:
        raise ConfigError(key, f"expected a positive size, got {text!r}")
    if size > 2**50:
        raise ConfigError(key, f"expected a size of at most 1024T, got {text!r}")
    return int(size)
