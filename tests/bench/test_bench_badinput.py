"""Bad input to ``diffsweep bench``: refused up front (one line naming the option and its limit,
exit 2), before a model is built or a row runs out of memory, and no ``--out`` file of the user's
is overwritten. The command runs in this process (``tests.helpers.cli.run``)."""

from __future__ import annotations

import json

import pytest

from tests.helpers.badinput import refused, untouched
from tests.helpers.cli import run

CPU = ["--device", "cpu"]


@pytest.mark.parametrize(("args", "needles"), [
    (["model", "--seq", "100000000"], ["--seq", "16,777,216"]),  # over a run config's train.seq_len limit
    (["model", "--seq", "16000000", "--micro-batch", "1"], ["--seq", "GB", "the planner's estimate"]),  # no RAM
    (["model", "--seq", "4000000"], ["--micro-batch", "16,777,216 tokens per step"]),  # 8 x 4M tokens a step
    (["model", "--micro-batch", "0"], ["--micro-batch"]),
    (["model", "--steps", "0"], ["--steps"]),
    (["model", "--steps", "-3"], ["--steps"]),
    (["model", "--warmup", "-1"], ["--warmup"]),
    (["attention", "--seq", "100000000"], ["--seq", "16,777,216"]),
    (["attention", "--seq", "16000000", "--layout", "3B"], ["--seq", "GB", "Q, K, V"]),  # ~0.8 TB at least
    (["attention", "--seq", "-5"], ["--seq"]),
    (["attention", "--batch-tokens", "0"], ["--batch-tokens"]),
    (["attention", "--batch-tokens", "99999999999"], ["--batch-tokens", "16,777,216"]),
    (["attention", "--reps", "0"], ["--reps"]),
    (["attention", "--warmup", "-1"], ["--warmup"]),
])
def test_bench_refuses_shapes_and_counts_out_of_range(tmp_path, args, needles):
    with untouched(tmp_path):
        r = run("bench", *args, *CPU, "--out", "result.json", cwd=tmp_path)
    refused(r, *needles)


@pytest.mark.parametrize("command", ["model", "attention"])
def test_bench_out_never_overwrites_a_file_it_did_not_write(tmp_path, command):
    (tmp_path / "notes.json").write_text('{"mine": true}\n')
    (tmp_path / "essay.txt").write_text("years of work\n")
    for name in ("notes.json", "essay.txt"):
        with untouched(tmp_path):
            r = run("bench", command, *CPU, "--out", name, cwd=tmp_path)
        refused(r, "--out", name, "not a diffsweep benchmark's results")


def test_an_earlier_result_and_an_empty_file_may_be_replaced(tmp_path):
    from diffsweep.bench.output import check_out, is_result

    earlier, empty = tmp_path / "model.json", tmp_path / "empty.json"
    earlier.write_text(json.dumps({"complete": False, "rows": []}))
    empty.write_text("")
    assert is_result(earlier) and not is_result(empty)
    check_out(earlier)
    check_out(empty)
