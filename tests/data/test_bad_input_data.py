"""Bad input to ``diffsweep data ...`` as a user meets it (issue #29): one ``error:`` line, exit 2,
no traceback, and nothing created, changed or deleted. First of all, ``data prepare --force``
never deletes what diffsweep did not write: an input, a folder holding inputs, a user's folder.

The command runs in this process (``tests.helpers.cli.run``): what it refuses and what it leaves
on disk do not depend on a fresh interpreter."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest

from diffsweep.config import ConfigError, EnvironmentUnavailable, TokenizerKind
from diffsweep.data.dataset import META_FILE
from diffsweep.data.prepare import Document, prepare, shard_record
from tests.helpers.badinput import refused, untouched
from tests.helpers.cli import run

ROWS = b"".join(json.dumps({"text": f"document number {i}, with some words in it"}).encode() + b"\n"
                for i in range(40))
BYTES = ("--tokenizer", "bytes")


def corpus(root: Path) -> Path:
    """``root/corpus/{a,b}.jsonl``: the inputs of a prepare."""
    folder = root / "corpus"
    folder.mkdir()
    (folder / "a.jsonl").write_bytes(ROWS)
    (folder / "b.jsonl").write_bytes(ROWS)
    return folder


def dataset(root: Path, name: str = "ds") -> Path:
    """A small real dataset (bytes tokenizer), made in-process."""
    source = root / f"{name}.txt"
    source.write_text("a small document to tokenize, long enough for both splits\n" * 4)
    prepare([Document(str(source), source.read_text(), source)], root / name, TokenizerKind.BYTES)
    source.unlink()
    return root / name


# --- data loss: --out and --force --------------------------------------------------------------------


def test_force_onto_the_input_file_deletes_nothing(tmp_path):
    corpus(tmp_path)
    with untouched(tmp_path):
        r = run("data", "prepare", "corpus/a.jsonl", "--out", "corpus/a.jsonl", "--force", *BYTES, cwd=tmp_path)
    refused(r, "--out", "corpus/a.jsonl", "is the input")


def test_force_onto_the_input_folder_deletes_nothing(tmp_path):
    corpus(tmp_path)
    with untouched(tmp_path):
        r = run("data", "prepare", "corpus", "--out", "corpus", "--force", *BYTES, cwd=tmp_path)
    refused(r, "--out", "corpus", "is the input")


@pytest.mark.parametrize("out", [".", ""], ids=["dot", "empty"])
def test_force_onto_a_folder_that_contains_the_inputs_deletes_nothing(tmp_path, out):
    corpus(tmp_path)
    with untouched(tmp_path):
        r = run("data", "prepare", "corpus/a.jsonl", "corpus/b.jsonl", "--out", out, "--force", *BYTES,
                      cwd=tmp_path)
    refused(r, "--out", "contains the input")


def test_out_inside_an_input_folder_is_refused(tmp_path):
    corpus(tmp_path)
    with untouched(tmp_path):
        r = run("data", "prepare", "corpus", "--out", "corpus/ds", *BYTES, cwd=tmp_path)
    refused(r, "--out", "corpus/ds", "lies inside the input corpus")


def test_force_onto_a_users_folder_without_meta_json_deletes_nothing(tmp_path):
    corpus(tmp_path)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("years of work")
    with untouched(tmp_path):
        r = run("data", "prepare", "corpus", "--out", "mine", "--force", *BYTES, cwd=tmp_path)
    refused(r, "mine", "--force replaces only a dataset", "no meta.json")


@pytest.mark.parametrize("meta", ['{"format": "someone-else/1"}', "{not json", '["diffsweep-tokens/1"]',
                                  '{"format": "diffsweep-tokens/1"}'],
                         ids=["other-format", "invalid-json", "not-object", "only-format"])
def test_force_onto_a_folder_whose_meta_json_is_not_diffsweeps_deletes_nothing(tmp_path, meta):
    corpus(tmp_path)
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / META_FILE).write_text(meta)
    (theirs / "train.bin").write_bytes(b"\x00" * 10)
    with untouched(tmp_path):
        r = run("data", "prepare", "corpus", "--out", "theirs", "--force", *BYTES, cwd=tmp_path)
    refused(r, "theirs", "--force replaces only a dataset", "meta.json")


def test_force_onto_a_dataset_holding_a_users_file_deletes_nothing(tmp_path):
    corpus(tmp_path)
    ds = dataset(tmp_path)
    (ds / "notes.md").write_text("mine")
    with untouched(tmp_path):
        r = run("data", "prepare", "corpus", "--out", "ds", "--force", *BYTES, cwd=tmp_path)
    refused(r, "ds", "holds 'notes.md'")


@pytest.mark.parametrize("target", ["corpus", "corpus/a.jsonl"], ids=["folder", "file"])
def test_force_onto_a_symlink_to_an_input_deletes_nothing(tmp_path, target):
    corpus(tmp_path)
    os.symlink(target, tmp_path / "link")
    with untouched(tmp_path):
        r = run("data", "prepare", "corpus", "--out", "link", "--force", *BYTES, cwd=tmp_path)
    refused(r, "--out", "link", "the input corpus")


def test_force_replaces_a_dataset_diffsweep_wrote(tmp_path):
    """The one thing --force replaces: a dataset of data prepare (no copies left beside it)."""
    corpus(tmp_path)
    dataset(tmp_path)
    r = run("data", "prepare", "corpus", "--out", "ds", "--force", *BYTES, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "ds" / META_FILE).read_text())["num_documents"] == 80
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus", "ds"]


def test_launch_force_onto_the_input_folder_deletes_nothing(tmp_path):
    corpus(tmp_path)
    with untouched(tmp_path):
        r = run("data", "prepare", "corpus", "--out", "corpus", "--force", "--launch", "--executor", "local",
                      *BYTES, cwd=tmp_path)
    refused(r, "--out", "corpus", "is the input")


def test_launch_force_onto_a_users_folder_deletes_nothing(tmp_path):
    corpus(tmp_path)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "keep.txt").write_text("mine")
    with untouched(tmp_path):
        r = run("data", "prepare", "corpus", "--out", "mine", "--force", "--launch", "--executor", "local",
                      *BYTES, cwd=tmp_path)
    refused(r, "mine", "--force replaces only a dataset")


def test_launch_force_never_empties_a_users_folder_named_like_a_launch_folder(tmp_path):
    corpus(tmp_path)
    (tmp_path / ".ds.prepare").mkdir()
    (tmp_path / ".ds.prepare" / "diary.txt").write_text("mine")
    with untouched(tmp_path):
        r = run("data", "prepare", "corpus", "--out", "ds", "--force", "--launch", "--executor", "local",
                      *BYTES, cwd=tmp_path)
    refused(r, ".ds.prepare", "holds 'diary.txt'", "not a launch folder")


# --- compressed inputs cut short ---------------------------------------------------------------------


def zstandard():
    return pytest.importorskip("zstandard", reason="reading .zst needs the zstandard package (the corpora extra)")


def test_a_zst_cut_inside_a_later_frame_is_truncated_not_shorter(tmp_path):
    zstd = zstandard().ZstdCompressor()
    first, second = zstd.compress(ROWS), zstd.compress(ROWS)
    (tmp_path / "c.jsonl.zst").write_bytes(first + second[: len(second) // 2])
    with untouched(tmp_path):
        r = run("data", "prepare", "c.jsonl.zst", "--out", "ds", *BYTES, cwd=tmp_path)
    refused(r, "c.jsonl.zst", "truncated")


def test_every_frame_of_a_whole_multi_frame_zst_is_read(tmp_path):
    zstd = zstandard().ZstdCompressor()
    (tmp_path / "c.jsonl.zst").write_bytes(zstd.compress(ROWS) + zstd.compress(ROWS))
    r = run("data", "prepare", "c.jsonl.zst", "--out", "ds", *BYTES, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "ds" / META_FILE).read_text())["num_documents"] == 80


@pytest.mark.parametrize("suffix", ["zst", "gz"])
def test_a_single_frame_cut_in_half_says_truncated(tmp_path, suffix):
    data = zstandard().ZstdCompressor().compress(ROWS) if suffix == "zst" else gzip.compress(ROWS)
    (tmp_path / f"c.jsonl.{suffix}").write_bytes(data[: len(data) // 2])
    with untouched(tmp_path):
        r = run("data", "prepare", f"c.jsonl.{suffix}", "--out", "ds", *BYTES, cwd=tmp_path)
    line = refused(r, f"c.jsonl.{suffix}", "truncated")
    assert "no documents" not in line


def test_an_empty_zst_is_refused_naming_it(tmp_path):
    zstandard()
    (tmp_path / "c.jsonl.zst").write_bytes(b"")
    with untouched(tmp_path):
        r = run("data", "prepare", "c.jsonl.zst", "--out", "ds", *BYTES, cwd=tmp_path)
    refused(r, "c.jsonl.zst", "empty file")


# --- text a tokenizer cannot take ---------------------------------------------------------------------


@pytest.mark.parametrize("tokenizer", ["bytes", "bpe", "cl100k_base"])
def test_a_lone_surrogate_is_refused_naming_file_and_row_for_every_tokenizer(tmp_path, tokenizer):
    if tokenizer == "cl100k_base":
        from diffsweep.data.tokenizers import Cl100kTokenizer

        try:
            Cl100kTokenizer()
        except EnvironmentUnavailable as exc:
            pytest.skip(f"cl100k_base is not installed here ({exc})")
    (tmp_path / "c.jsonl").write_text('{"text": "fine"}\n{"text": "bad \\ud800 here"}\n')
    with untouched(tmp_path):
        r = run("data", "prepare", "c.jsonl", "--out", "ds", "--tokenizer", tokenizer, cwd=tmp_path)
    refused(r, "c.jsonl:2", "lone surrogate")


def test_a_surrogate_pair_is_text(tmp_path):
    (tmp_path / "c.jsonl").write_text('{"text": "an emoji \\ud83d\\ude00 here"}\n')
    r = run("data", "prepare", "c.jsonl", "--out", "ds", *BYTES, cwd=tmp_path)
    assert r.returncode == 0, r.stderr


# --- a damaged save_to_disk folder ----------------------------------------------------------------------


@pytest.mark.parametrize(("file", "content", "needle"), [
    ("state.json", "{}", "_data_files"),
    ("state.json", "not json", "not a readable JSON file"),
    ("state.json", "[1]", "expected a JSON object"),
    ("dataset_info.json", "{oops", "not a readable JSON file"),
], ids=["state-empty", "state-garbage", "state-list", "info-garbage"])
def test_a_damaged_save_to_disk_folder_is_one_line_naming_the_file(tmp_path, file, content, needle):
    datasets = pytest.importorskip("datasets", reason="save_to_disk folders need the datasets package")
    datasets.Dataset.from_dict({"text": ["one document", "another one"]}).save_to_disk(str(tmp_path / "hf"))
    (tmp_path / "hf" / file).write_text(content)
    with untouched(tmp_path):
        r = run("data", "prepare", "hf", "--out", "ds", *BYTES, cwd=tmp_path)
    refused(r, f"hf/{file}", needle)


# --- a damaged dataset: data info / verify ---------------------------------------------------------


@pytest.mark.parametrize("name", ["train-00000.bin", "val-00000.bin"])
def test_a_shard_cut_short_is_one_line_naming_it(tmp_path, name):
    ds = dataset(tmp_path)
    file = ds / name
    file.write_bytes(file.read_bytes()[:-1])  # not a whole number of tokens
    with untouched(tmp_path):
        r = run("data", "info", "ds", cwd=tmp_path)
    refused(r, f"ds/{name}", "expected")
    with untouched(tmp_path):
        r = run("data", "verify", "ds", cwd=tmp_path)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr  # verify reports damage: exit 1
    assert f"{name}: " in r.stdout and "truncated" in r.stdout


def test_an_old_train_bin_cut_short_is_one_line_naming_it(tmp_path):
    """A dataset from before shards (train.bin / val.bin, no shards in meta.json)."""
    ds = dataset(tmp_path)
    meta = json.loads((ds / META_FILE).read_text())
    meta["shards"] = None
    (ds / META_FILE).write_text(json.dumps(meta))
    (ds / "train-00000.bin").rename(ds / "train.bin")
    (ds / "val-00000.bin").rename(ds / "val.bin")
    (ds / "train.bin").write_bytes((ds / "train.bin").read_bytes()[:-3])
    with untouched(tmp_path):
        r = run("data", "info", "ds", cwd=tmp_path)
    refused(r, "ds/train.bin", "expected")


@pytest.mark.parametrize("edit", [
    lambda m: {k: v for k, v in m.items() if k != "tokenizer_sha256"},
    lambda m: m | {"num_documents": "many"},
    lambda m: m | {"val_fraction": float("nan")},
    lambda m: m | {"eos_id": 10**6},
    lambda m: m | {"val_split": "random"},
    lambda m: m | {"sources": {"a": 1}},
    lambda m: m | {"shards": [m["shards"][0] | {"sha256": {"train": 5, "val": "x"}}]},
    lambda m: m | {"shards": [m["shards"][0] | {"documents": -2}]},
    lambda m: m | {"vocab_size": True},
], ids=["missing", "documents-type", "nan", "eos-range", "val-split", "sources-type", "sha-type",
        "shard-documents", "vocab-bool"])
@pytest.mark.parametrize("command", [("info",), ("verify",), ("verify", "--json")])
def test_a_damaged_meta_json_is_one_line_naming_it(tmp_path, edit, command):
    ds = dataset(tmp_path)
    meta = json.loads((ds / META_FILE).read_text())
    (ds / META_FILE).write_text(json.dumps(edit(meta)))
    with untouched(tmp_path):
        r = run("data", *command, "ds", cwd=tmp_path)
    refused(r, "ds/meta.json", "not a valid dataset metadata file")


# --- options given valid-looking nonsense -------------------------------------------------------------


@pytest.mark.parametrize(("args", "needles"), [
    (("--tokenizer", "bpe", "--max-tokens", "1"), ("--max-tokens", "at least 3 tokens", "bpe")),
    (("--tokenizer", "bpe", "--max-tokens", "1", "--val-split", "document"), ("--max-tokens", "at least 2 tokens")),
    (("--tokenizer", "bpe", "--vocab-size", "10000000000"), ("--vocab-size", "257 to 1,048,576")),
    (("--tokenizer", "bpe", "--vocab-size", "0"), ("--vocab-size", "257 to 1,048,576")),
    ((*BYTES, "--shard-size", "nanM"), ("--shard-size", "'nanM'")),
    ((*BYTES, "--shard-size", "inf"), ("--shard-size", "'inf'")),
    ((*BYTES, "--shard-size", "1e400"), ("--shard-size", "'1e400'")),
    ((*BYTES, "--shard-size", ""), ("--shard-size", "''")),
    ((*BYTES, "--shard-size", "0"), ("--shard-size", "positive")),
    ((*BYTES, "--shard-size", "-5M"), ("--shard-size", "positive")),
    ((*BYTES, "--shard-size", "5000T"), ("--shard-size", "at most")),
    ((*BYTES, "--workers", "0"), ("--workers", "at least 1")),
    ((*BYTES, "--workers", "-2"), ("--workers", "at least 1")),
    ((*BYTES, "--sample", "0"), ("--sample", "(0, 1]")),
    ((*BYTES, "--sample", "-0.5"), ("--sample", "(0, 1]")),
    ((*BYTES, "--launch", "--executor", "local", "--tasks", "0"), ("--tasks", "at least 1")),
    ((*BYTES, "--text-field", ""), ("--text-field", "field name")),
], ids=["max-tokens-tail", "max-tokens-document", "vocab-huge", "vocab-zero", "shard-nan", "shard-inf",
        "shard-overflow", "shard-empty", "shard-zero", "shard-negative", "shard-huge", "workers-zero",
        "workers-negative", "sample-zero", "sample-negative", "tasks-zero", "text-field-empty"])
def test_nonsense_option_values_are_one_line_naming_the_option(tmp_path, args, needles):
    corpus(tmp_path)
    with untouched(tmp_path):
        r = run("data", "prepare", "corpus", "--out", "ds", *args, cwd=tmp_path)
    line = refused(r, *needles)
    assert "--sample" not in line or "--sample" in args


def test_vocab_size_with_a_fixed_vocabulary_is_a_warning(tmp_path):
    corpus(tmp_path)
    r = run("data", "prepare", "corpus", "--out", "ds", *BYTES, "--vocab-size", "300", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "warning: --vocab-size: ignored" in r.stderr


@pytest.mark.parametrize(("rows", "needles"), [
    (b'[1, 2]\n', ("c.jsonl:1", "not a JSON object")),
    (b'"text"\n', ("c.jsonl:1", "not a JSON object")),
    (b'{"text": 5}\n', ("c.jsonl:1", "not a string")),
    (b'{"text": ["a"]}\n', ("c.jsonl:1", "not a string")),
    (b'{"body": "a"}\n', ("c.jsonl:1", "no 'text' field")),
], ids=["array", "string", "number", "list", "no-field"])
def test_malformed_jsonl_rows_are_one_line_naming_the_row(tmp_path, rows, needles):
    (tmp_path / "c.jsonl").write_bytes(rows)
    with untouched(tmp_path):
        r = run("data", "prepare", "c.jsonl", "--out", "ds", *BYTES, cwd=tmp_path)
    refused(r, *needles)


def test_parquet_without_the_text_column_is_one_line(tmp_path):
    pa = pytest.importorskip("pyarrow", reason="Parquet needs pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"body": ["a", "b"]}), tmp_path / "c.parquet")
    with untouched(tmp_path):
        r = run("data", "prepare", "c.parquet", "--out", "ds", *BYTES, cwd=tmp_path)
    refused(r, "c.parquet", "no 'text' column")


# --- a launched prepare's own files, damaged ------------------------------------------------------------


@pytest.mark.parametrize("record", [
    {"tasks": "many"},
    {"tasks": [{"shards": [0], "attempts": [{"executor": "local"}]}]},
    {"tasks": [{"shards": ["x"], "attempts": []}]},
    {"replace": "yes"},
], ids=["tasks-type", "attempt-fields", "shard-type", "replace-type"])
@pytest.mark.parametrize("command", ["status", "logs", "cancel"])
def test_a_damaged_launch_record_is_one_line_naming_it(tmp_path, record, command):
    folder = tmp_path / ".ds.prepare"
    folder.mkdir()
    good = {"format": "diffsweep-prepare-launch/1", "out": str(tmp_path / "ds"), "request": {}, "replace": False,
            "profile": None, "executor": "local", "tasks": [{"shards": [0], "attempts": []}]}
    (folder / "launch.json").write_text(json.dumps(good | record))
    with untouched(tmp_path):
        r = run("data", command, "ds", cwd=tmp_path)
    refused(r, ".ds.prepare/launch.json")


@pytest.mark.parametrize(("text", "words"), [
    (None, "plan.json: not a readable prepare plan (No such file or directory)"),
    ("{not json", "plan.json: not a readable prepare plan (Expecting property name"),
    ('{"format": "diffsweep-prepare-plan/9"}', ("plan.json: format: expected 'diffsweep-prepare-plan/1', got "
                                               "'diffsweep-prepare-plan/9'")),
    ('{"format": "diffsweep-prepare-plan/1"}', "plan.json: tokenizer: is required and missing"),
], ids=["missing", "not-json", "other-version", "fields-missing"])
def test_a_staging_folder_whose_plan_is_missing_or_damaged_is_one_error_naming_it(tmp_path, text, words):
    """A Slurm task (or ``finish``) reads the plan ``stage`` wrote; one that is not there, not JSON,
    of another version or short of fields is one ConfigError naming the file and what is wrong."""
    from diffsweep.data.shards import read_plan

    if text is not None:
        (tmp_path / "plan.json").write_text(text)
    with pytest.raises(ConfigError) as err:
        read_plan(tmp_path)
    assert str(err.value).startswith(str(tmp_path)) and words in str(err.value), err.value


@pytest.mark.parametrize("record", ['{"tokens": "x"}', '[]', '{"tokens": {"train": 1, "val": 1}, "itemsize": 2}'],
                         ids=["tokens-type", "not-object", "fields-missing"])
def test_a_damaged_shard_record_means_the_shard_is_written_again(tmp_path, record):
    staging = tmp_path / "staging"
    staging.mkdir()
    for split in ("train", "val"):
        (staging / f"{split}-00000.bin").write_bytes(b"\x00\x00")
    (staging / "shard-00000.json").write_text(record)
    assert shard_record(staging, 0) is None
