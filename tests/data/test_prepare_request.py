"""``PrepareRequest`` checks itself when made (the CLI only builds it): each problem names the field
at fault, so any caller, not only ``diffsweep data prepare``, gets the same checks."""

from __future__ import annotations

from pathlib import Path

import pytest

from diffsweep.config import ConfigError, ConfigWarning, TokenizerKind
from diffsweep.data.request import DEFAULT_VOCAB, DEMO_OUT, PrepareRequest

TEXT = {"inputs": ("corpus.txt",), "out": Path("data/corpus")}


@pytest.mark.parametrize(("fields", "key", "message"), [
    ({"inputs": ()}, "", "give either INPUTS or --demo (not both)"),
    ({"demo": True}, "", "give either INPUTS or --demo (not both)"),
    ({"out": None}, "out", "expected a directory for the dataset"),
    ({"workers": 0}, "workers", "expected at least 1 worker, got 0"),
    ({"shard_size": "lots"}, "shard_size", "expected a size such as 256M or 1G, got 'lots'"),
    ({"shard_size": "0.1"}, "shard_size", "expected a positive size, got '0.1'"),
    ({"tasks": 4}, "tasks", "applies only with --launch"),
    ({"wait": True}, "wait", "applies only with --launch"),
    ({"launch": True, "workers": 2}, "workers", "does not apply with --launch (use --tasks)"),
    ({"val_fraction": 1.0}, "val_fraction", "expected a value in (0, 1), got 1.0"),
    ({"val_split": "random"}, "val_split", "expected one of"),
])
def test_a_bad_request_names_its_field(fields, key, message):
    with pytest.raises(ConfigError) as caught:
        PrepareRequest(**(TEXT | fields))
    assert caught.value.key == key and caught.value.message.startswith(message), caught.value


def test_the_demo_refuses_what_applies_to_inputs_only():
    for fields in ({"launch": True}, {"sample": 0.5}, {"hf_config": "en"}):
        with pytest.raises(ConfigError, match="INPUTS, not to --demo"):
            PrepareRequest(demo=True, **fields)


def test_defaults_are_resolved_by_the_request():
    demo = PrepareRequest(demo=True)
    assert demo.dataset_dir == DEMO_OUT and demo.vocabulary == DEFAULT_VOCAB and demo.shard_bytes == 256 * 2**20
    assert PrepareRequest(**TEXT, vocab_size=512, shard_size="1G").vocabulary == 512
    with pytest.warns(ConfigWarning, match="--vocab-size: ignored"):
        PrepareRequest(**TEXT, tokenizer=TokenizerKind.BYTES, vocab_size=512)
