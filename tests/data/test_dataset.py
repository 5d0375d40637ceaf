"""``data prepare`` on real text files (CPython's pydoc topics) and the dataset it writes: metadata,
memory-mapped round trip, no clobbering, one-line errors naming the file or key, and the
deterministic batch sampling the trainer uses."""

from __future__ import annotations

import hashlib
import json
import pydoc_data.topics
from pathlib import Path

import numpy as np
import pytest

from diffsweep.config import ConfigError, TokenizerKind
from diffsweep.data.dataset import (
    FORMAT,
    META_FILE,
    batch_starts,
    check_compatible,
    open_dataset,
    read_meta,
    val_starts,
    windows,
)
from diffsweep.data.prepare import Document, prepare
from diffsweep.data.sources import Corpus, open_sources
from diffsweep.data.tokenizers import load_tokenizer

TOPICS = sorted(pydoc_data.topics.topics.items())[:24]  # ~0.2 MB: enough for a 512-token BPE
VAL_FRACTION = 0.1


def _write_corpus(root: Path) -> Path:
    """One .txt per topic (some in a sub-directory), plus files a directory search must skip."""
    corpus = root / "corpus"
    (corpus / "more").mkdir(parents=True)
    for i, (name, text) in enumerate(TOPICS):
        (corpus / ("more" if i % 3 == 0 else "") / f"{name}.txt").write_text(text, encoding="utf-8")
    (corpus / "notes.py").write_text("print('not text')\n")
    (corpus / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe")
    return corpus


def _siblings(out: Path) -> list[str]:
    """Names beside ``out`` that look like prepare's staging or old directories."""
    return sorted(p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}."))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return _write_corpus(tmp_path_factory.mktemp("prep"))


@pytest.fixture(scope="module")
def bpe_dataset(corpus) -> tuple[Path, object, list[Document]]:
    documents = list(Corpus(open_sources([corpus])).documents())
    out = corpus.parent / "ds"
    meta = prepare(documents, out, TokenizerKind.BPE, vocab_size=512, val_fraction=VAL_FRACTION)
    return out, meta, documents


def _files(inputs: list[Path]) -> list[Path]:
    """The files ``open_sources`` reads for ``inputs``."""
    return [source.path for source in open_sources(inputs)]


def test_text_files_searches_directories_and_keeps_given_files(corpus, tmp_path):
    """A directory contributes its .txt/.md/.rst files (recursively, sorted); a file given by name
    is taken as is, whatever its suffix."""
    files = _files([corpus])
    assert len(files) == len(TOPICS)
    assert files == sorted(files)
    assert all(f.suffix == ".txt" for f in files)
    assert any(f.parent.name == "more" for f in files)
    given = corpus / "notes.py"
    assert _files([given, corpus])[0] == given


def test_meta_fields(bpe_dataset, corpus):
    """meta.json: token counts equal encoding each document plus eos, split per document by
    val_fraction; every source with its sha256 and size; uint16 for a 512-token vocabulary."""
    out, meta, documents = bpe_dataset
    tok = load_tokenizer(TokenizerKind.BPE, out)
    lengths = [len(tok.encode(d.text)) for d in documents]
    num_val = [int(round(n * VAL_FRACTION)) for n in lengths]
    assert meta.tokenizer is TokenizerKind.BPE
    assert (meta.vocab_size, meta.eos_id, meta.dtype) == (512, 0, "uint16")
    n = len(documents)  # each part of each document ends with eos
    assert meta.tokens == {"train": sum(lengths) - sum(num_val) + n, "val": sum(num_val) + n}
    assert meta.num_documents == len(TOPICS) == len(documents)
    assert meta.val_fraction == VAL_FRACTION
    assert meta.tokenizer_sha256 == tok.fingerprint()
    assert meta.tokenizer_version is not None and meta.tokenizer_version.startswith("tokenizers 0.")
    files = _files([corpus])
    assert [s["path"] for s in meta.sources] == [str(f) for f in sorted(files)]
    for source, file in zip(meta.sources, sorted(files), strict=True):
        assert source["sha256"] == hashlib.sha256(file.read_bytes()).hexdigest()
        assert source["bytes"] == len(file.read_bytes())
    assert len(meta.fingerprint) == 64 and int(meta.fingerprint, 16) >= 0
    on_disk = json.loads((out / META_FILE).read_text())
    assert on_disk["format"] == FORMAT and on_disk["tokenizer"] == "bpe"
    assert on_disk == meta.to_json()
    assert read_meta(out / META_FILE) == meta
    assert sorted(p.name for p in out.iterdir()) == ["meta.json", "tokenizer.json", "train-00000.bin", "val-00000.bin"]
    assert _siblings(out) == []


def test_open_dataset_round_trip(bpe_dataset):
    """The memory-mapped splits hold each document's tokens in order: its train part and its val
    part, each followed by the end-of-text id, decode back to the document."""
    out, meta, documents = bpe_dataset
    ds = open_dataset(out)
    tok = load_tokenizer(TokenizerKind.BPE, out)
    train, val = ds.split("train"), ds.split("val")
    assert isinstance(train, np.memmap) and train.dtype == np.uint16
    assert (len(train), len(val)) == (meta.tokens["train"], meta.tokens["val"])
    assert ds.meta == meta
    t = v = 0
    for doc in documents:
        ids = tok.encode(doc.text)
        num_val = int(round(len(ids) * VAL_FRACTION))
        got_train = train[t : t + len(ids) - num_val + 1].tolist()
        got_val = val[v : v + num_val + 1].tolist()
        assert got_train[-1] == got_val[-1] == tok.eos_id, doc.name  # both parts end with eos
        assert got_train[:-1] + got_val[:-1] == ids, doc.name
        assert tok.decode(got_train[:-1] + got_val[:-1]) == doc.text
        t, v = t + len(got_train), v + len(got_val)
    assert (t, v) == (len(train), len(val))


def test_bytes_dataset_has_no_eos(tmp_path):
    """bytes: every byte of every document, no end-of-document token, uint16 files."""
    docs = [Document(n, text, Path(pydoc_data.topics.__file__)) for n, text in TOPICS[:3]]
    meta = prepare(docs, tmp_path / "ds", TokenizerKind.BYTES, val_fraction=0.5)
    data = open_dataset(tmp_path / "ds")
    assert (meta.vocab_size, meta.eos_id, meta.dtype) == (256, None, "uint16")
    assert meta.tokens["train"] + meta.tokens["val"] == sum(len(t.encode()) for _, t in TOPICS[:3])
    assert len(meta.sources) == 1  # three documents from one file: one source
    first = TOPICS[0][1].encode()
    num_train = len(first) - round(len(first) * 0.5)
    assert bytes(data.split("train")[:num_train].tolist()) == first[:num_train]
    assert bytes(data.split("val")[: len(first) - num_train].tolist()) == first[num_train:]


def test_cl100k_dataset_uses_uint32(tmp_path):
    """A vocabulary above 65,536 ids is stored as uint32, and ids survive the round trip."""
    text = TOPICS[5][1][:3000]
    src = tmp_path / "a.txt"
    src.write_text(text)
    meta = prepare(Corpus(open_sources([src])), tmp_path / "ds", TokenizerKind.CL100K_BASE)
    assert (meta.vocab_size, meta.eos_id, meta.dtype) == (100277, 100257, "uint32")
    ds = open_dataset(tmp_path / "ds")
    tok = load_tokenizer(TokenizerKind.CL100K_BASE, tmp_path / "ds")
    ids = np.concatenate([ds.split("train"), ds.split("val")]).tolist()
    assert ds.split("train").dtype == np.uint32
    encoded = tok.encode(text)
    num_train = len(encoded) - round(len(encoded) * 0.05)
    assert ids == encoded[:num_train] + [100257] + encoded[num_train:] + [100257]
    assert max(ids) > 65535  # the eos id alone would not fit uint16
    assert not (tmp_path / "ds" / "tokenizer.json").exists()


def test_fingerprint_is_content_addressed(tmp_path):
    """The same text gives the same dataset fingerprint wherever it lives; another split differs."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    for d in (a, b):
        (d / "x.txt").write_text(TOPICS[0][1])
    m1 = prepare(Corpus(open_sources([a])), tmp_path / "d1", TokenizerKind.BYTES)
    m2 = prepare(Corpus(open_sources([b])), tmp_path / "d2", TokenizerKind.BYTES)
    m3 = prepare(Corpus(open_sources([b])), tmp_path / "d3", TokenizerKind.BYTES, val_fraction=0.2)
    assert m1.fingerprint == m2.fingerprint != m3.fingerprint
    (b / "x.txt").write_text(TOPICS[0][1] + " ")
    m4 = prepare(Corpus(open_sources([b])), tmp_path / "d4", TokenizerKind.BYTES)
    assert m4.fingerprint != m1.fingerprint


# --- no clobbering --------------------------------------------------------------------------------


def _docs(n: int = 2) -> list[Document]:
    src = Path(pydoc_data.topics.__file__)
    return [Document(name, text, src) for name, text in TOPICS[:n]]


def test_existing_out_dir_is_not_clobbered(tmp_path):
    """An existing output directory is a ConfigError naming it, and is left untouched."""
    out = tmp_path / "ds"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(ConfigError, match="--force") as err:
        prepare(_docs(), out, TokenizerKind.BYTES)
    assert str(out) in str(err.value)
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    assert _siblings(out) == []


def test_force_replaces(tmp_path):
    """--force replaces an old dataset entirely and leaves no staging or old copies behind; a file in
    it that ``prepare`` did not write makes it no dataset to replace (the file is kept)."""
    out = tmp_path / "ds"
    prepare(_docs(1), out, TokenizerKind.BYTES)
    meta = prepare(_docs(2), out, TokenizerKind.BYTES, force=True)
    assert open_dataset(out).meta == meta and meta.num_documents == 2
    assert _siblings(out) == []
    (out / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="holds 'notes.txt'"):
        prepare(_docs(1), out, TokenizerKind.BYTES, force=True)
    assert (out / "notes.txt").read_text() == "mine" and open_dataset(out).meta == meta


def test_failure_midway_leaves_nothing(tmp_path, monkeypatch):
    """A failure after tokenizing started (the tokenizer fails on the last document) removes the
    staging directory, creates no output, and with --force keeps the old dataset intact."""
    from diffsweep.data.tokenizers import BytesTokenizer

    def encode(self, text):
        if text.startswith("bad"):
            raise RuntimeError("the tokenizer failed")
        return list(text.encode())

    monkeypatch.setattr(BytesTokenizer, "encode", encode)
    bad = Document("bad", "bad text", Path(pydoc_data.topics.__file__))
    out = tmp_path / "ds"
    with pytest.raises(RuntimeError):
        prepare([*_docs(), bad], out, TokenizerKind.BYTES)
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == []

    old = prepare(_docs(1), out, TokenizerKind.BYTES)
    with pytest.raises(RuntimeError):
        prepare([*_docs(), bad], out, TokenizerKind.BYTES, force=True)
    assert open_dataset(out).meta == old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds"]


def test_interrupted_progress_leaves_nothing(tmp_path):
    """An interrupt raised from inside the progress wrapper (Ctrl-C during tokenizing) cleans up."""

    def progress(docs, total_chars):
        for i, doc in enumerate(docs):
            if i == 1:
                raise KeyboardInterrupt
            yield doc

    with pytest.raises(KeyboardInterrupt):
        prepare(_docs(3), tmp_path / "ds", TokenizerKind.BYTES, progress=progress)
    assert list(tmp_path.iterdir()) == []


def test_non_utf8_input_leaves_no_out_dir(tmp_path, corpus):
    """A non-UTF-8 file among the inputs is a ConfigError naming it, before anything is written."""
    inputs = tmp_path / "in"
    inputs.mkdir()
    (inputs / "a.txt").write_text(TOPICS[0][1])
    (inputs / "b.txt").write_bytes(b"caf\xe9 latin-1 text")
    out = tmp_path / "ds"
    with pytest.raises(ConfigError) as err:
        prepare(Corpus(open_sources([inputs])), out, TokenizerKind.BYTES)
    assert str(inputs / "b.txt") in str(err.value)
    assert "UTF-8" in str(err.value) and "byte 3" in str(err.value)
    assert not out.exists() and _siblings(out) == []


# --- input errors ---------------------------------------------------------------------------------


def test_missing_path_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError) as err:
        _files([tmp_path / "nope"])
    assert str(err.value) == f"{tmp_path / 'nope'}: no such file or directory"


def test_directory_without_text_files_is_a_config_error(tmp_path):
    (tmp_path / "x.py").write_text("")
    with pytest.raises(ConfigError) as err:
        _files([tmp_path])
    assert str(tmp_path) in str(err.value) and ".txt" in str(err.value)


def test_no_inputs_and_bad_val_fraction(tmp_path):
    with pytest.raises(ConfigError, match="INPUTS"):
        _files([])
    with pytest.raises(ConfigError, match="INPUTS"):
        prepare([], tmp_path / "ds", TokenizerKind.BYTES)
    for bad in (0.0, 1.0, -0.1):
        with pytest.raises(ConfigError, match="val_fraction"):
            prepare(_docs(), tmp_path / "ds", TokenizerKind.BYTES, val_fraction=bad)
    assert list(tmp_path.iterdir()) == []


# --- opening errors -------------------------------------------------------------------------------


@pytest.fixture
def small_dataset(tmp_path) -> Path:
    prepare(_docs(2), tmp_path / "ds", TokenizerKind.BYTES)
    return tmp_path / "ds"


def test_missing_dataset_and_meta(tmp_path, small_dataset):
    with pytest.raises(ConfigError, match=r"^data\.path: .*does not exist"):
        open_dataset(tmp_path / "nope")
    (small_dataset / META_FILE).unlink()
    with pytest.raises(ConfigError) as err:
        open_dataset(small_dataset, key="train.data")
    assert err.value.key == "train.data" and str(small_dataset / META_FILE) in str(err.value)


@pytest.mark.parametrize("split", ["train", "val"])
def test_truncated_bin_is_a_config_error_naming_it(small_dataset, split):
    """A token file whose size disagrees with meta.json is caught when the dataset is opened."""
    file = small_dataset / f"{split}-00000.bin"
    size = file.stat().st_size
    with open(file, "r+b") as f:
        f.truncate(size - 2)
    with pytest.raises(ConfigError) as err:
        open_dataset(small_dataset)
    message = str(err.value)
    assert message.startswith("data.path: ") and str(file) in message
    assert f"expected {size} bytes" in message and f"found {size - 2}" in message
    file.unlink()
    with pytest.raises(ConfigError, match="no file"):
        open_dataset(small_dataset)


@pytest.mark.parametrize(
    "edit",
    [
        lambda m: "{not json",
        lambda m: "[1, 2]",
        lambda m: json.dumps(m | {"format": "other/1"}),
        lambda m: json.dumps({k: v for k, v in m.items() if k != "vocab_size"}),
        lambda m: json.dumps(m | {"extra": 1}),
        lambda m: json.dumps(m | {"tokenizer": "gpt2"}),
        lambda m: json.dumps(m | {"tokens": {"train": m["tokens"]["train"]}}),
        lambda m: json.dumps(m | {"tokens": "many"}),
        lambda m: json.dumps(m | {"tokens": {"train": -1, "val": 0}}),
        lambda m: json.dumps(m | {"dtype": "float32"}),
        lambda m: json.dumps(m | {"dtype": "nonsense"}),
        lambda m: json.dumps(m | {"shards": [m["shards"][0] | {"extra": 1}]}),
        lambda m: json.dumps(m | {"shards": [m["shards"][0] | {"tokens": {"train": 1, "val": 1}}]}),
        lambda m: json.dumps(m | {"shards": []}),
        lambda m: json.dumps(m | {"tokens": m["tokens"] | {"test": 3}}),
    ],
    ids=["syntax", "not-object", "format", "missing", "extra", "tokenizer", "no-val", "tokens-type", "negative",
         "dtype-float", "dtype-unknown", "shard-extra", "shard-sum", "no-shards", "third-split"],
)
def test_bad_meta_json_is_a_config_error_naming_it(small_dataset, edit):
    """Every malformed meta.json is one ConfigError whose key is the file (no KeyError/TypeError)."""
    meta_path = small_dataset / META_FILE
    meta_path.write_text(edit(json.loads(meta_path.read_text())))
    with pytest.raises(ConfigError) as err:
        open_dataset(small_dataset)
    assert err.value.key == str(meta_path)
    assert "not a valid dataset metadata file" in str(err.value) and "\n" not in str(err.value)


# --- compatibility with a config ----------------------------------------------------------------


def test_check_compatible(bpe_dataset):
    """Each mismatch names the config key to change; a fitting config passes."""
    _, meta, _ = bpe_dataset
    check_compatible(meta, TokenizerKind.BPE, 512, 32)
    check_compatible(meta, TokenizerKind.BPE, 1024, meta.tokens["val"] - 1)  # exactly enough tokens
    with pytest.raises(ConfigError) as err:
        check_compatible(meta, TokenizerKind.BYTES, 512, 32)
    assert err.value.key == "data.tokenizer" and "'bytes'" in str(err.value) and "'bpe'" in str(err.value)
    with pytest.raises(ConfigError) as err:
        check_compatible(meta, TokenizerKind.BPE, 511, 32)
    assert err.value.key == "model.vocab_size" and "511" in str(err.value) and "512" in str(err.value)
    with pytest.raises(ConfigError) as err:
        check_compatible(meta, TokenizerKind.BPE, 512, meta.tokens["val"])
    assert err.value.key == "train.seq_len" and "val split" in str(err.value)


# --- sampling -------------------------------------------------------------------------------------


def test_batch_starts_are_a_pure_function_of_seed_and_step():
    """Same (seed, step) gives the same starts; another step or seed gives others; all windows of
    seq_len + 1 tokens fit, and both ends of the range are reachable."""
    a = batch_starts(7, 3, 64, 1000, 32)
    assert np.array_equal(a, batch_starts(7, 3, 64, 1000, 32))
    assert not np.array_equal(a, batch_starts(7, 4, 64, 1000, 32))
    assert not np.array_equal(a, batch_starts(8, 3, 64, 1000, 32))
    many = np.concatenate([batch_starts(0, s, 256, 100, 32) for s in range(1, 50)])
    assert many.min() == 0 and many.max() == 100 - 32 - 1  # last window ends at the last token
    tokens = np.arange(100, dtype=np.uint16)
    w = windows(tokens, many, 32)
    assert w.shape == (len(many), 33) and w.dtype == np.int64
    assert np.array_equal(w[:, 0], many) and np.array_equal(w[:, -1], many + 32)


def test_batch_starts_with_the_smallest_dataset():
    """With exactly seq_len + 1 tokens (check_compatible's minimum) the only window is at 0."""
    assert batch_starts(0, 1, 5, 33, 32).tolist() == [0] * 5


def test_val_starts_non_overlapping_and_capped():
    """Validation windows predict disjoint tokens, fit the split, and stop at max_tokens."""
    starts = val_starts(1000, 32, 10_000)
    assert starts.tolist() == [32 * i for i in range(31)]  # (1000 - 1) // 32 windows
    assert starts[-1] + 33 <= 1000
    assert val_starts(1000, 32, 100).tolist() == [0, 32, 64]  # 3 windows = 96 <= 100 predicted tokens
    assert val_starts(1000, 32, 10).tolist() == [0]  # at least one window
    assert val_starts(33, 32, 10_000).tolist() == [0]
    assert val_starts(65, 32, 10_000).tolist() == [0, 32]
    targets = windows(np.arange(1000), val_starts(1000, 32, 10_000), 32)[:, 1:].ravel()
    assert len(set(targets.tolist())) == len(targets)
    assert np.array_equal(val_starts(1000, 32, 500), val_starts(1000, 32, 500))

