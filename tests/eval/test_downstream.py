"""The downstream probe (lm-eval, Table 1): the adapter's log-likelihoods and greedy generations equal
a direct computation with the model; the probe's accuracy on a tiny local task is the fraction of
items whose gold choice the model scores highest; it runs offline and through the CLI."""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("lm_eval", reason="needs lm-eval (pip install 'diffsweep[lm-eval]')")

from lm_eval.api.instance import Instance  # noqa: E402

from diffsweep.config import ConfigError, EnvironmentUnavailable  # noqa: E402
from diffsweep.eval.lm_eval_adapter import DiffsweepLM  # noqa: E402
from diffsweep.eval.loading import load_trained  # noqa: E402
from diffsweep.eval.probe import EvalContext, probe_requests  # noqa: E402
from diffsweep.eval.probes.downstream import DownstreamProbe, DownstreamSettings  # noqa: E402
from tests.helpers.cli import run as cli  # noqa: E402

TASKS = Path(__file__).parent / "data" / "tiny_task"
SEQ_LEN = 128  # the trained_run's train.seq_len

# One worker runs these and tests/eval/test_runner.py: the session's trained run is trained once, and
# lm-eval's index of its ~15k task YAMLs with TASKS (cached per process, ~14 CPU-s) is built once.
pytestmark = pytest.mark.xdist_group("trained_run")


@pytest.fixture(scope="module")
def trained(trained_run):
    return load_trained(trained_run, device=torch.device("cpu"))


@pytest.fixture()
def hf_cache(tmp_path, monkeypatch):
    """HF datasets' cache in a temporary directory (not the user's); the network cut off."""
    import datasets.config
    import huggingface_hub.constants

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf_datasets")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf_hub"))

    def refuse(*args, **kwargs):
        raise AssertionError(f"a network connection was attempted: {args}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    return tmp_path


def direct(model, tokenizer, context: str, continuation: str) -> tuple[float, bool]:
    """log p(continuation | context) computed with the model alone: trailing whitespace of the
    context moves to the continuation; the continuation's tokens are those of the whole text after
    the context's; the input is the last SEQ_LEN tokens before the last one."""
    if context:
        spaces = len(context) - len(context.rstrip())
        if spaces:
            context, continuation = context[:-spaces], context[-spaces:] + continuation
        ctx = tokenizer.encode(context)
        cont = tokenizer.encode(context + continuation)[len(ctx):]
    else:
        ctx, cont = [tokenizer.eos_id], tokenizer.encode(continuation)
    tokens = (ctx + cont)[-(SEQ_LEN + 1):]
    with torch.no_grad():
        logits = model(torch.tensor([tokens[:-1]]))[0].double()
    logprobs = logits.log_softmax(-1)[-len(cont):]
    target = torch.tensor(cont)
    return float(logprobs[torch.arange(len(cont)), target].sum()), bool((logprobs.argmax(-1) == target).all())


def requests(kind: str, args: list[tuple]) -> list[Instance]:
    return [Instance(request_type=kind, doc={}, arguments=a, idx=0) for a in args]


def test_loglikelihood_is_the_models_own(trained):
    model, tok = trained.model, trained.tokenizer
    lm = DiffsweepLM(model, tok, seq_len=SEQ_LEN, device=torch.device("cpu"), batch_size=3)
    long_context = "The quick brown fox jumps over the lazy dog near the river bank. " * 30
    assert len(tok.encode(long_context)) > 2 * SEQ_LEN  # truncated from the left
    context = "Return the value of the expression"
    with torch.no_grad():  # the model's own greedy continuation: its greedy flag is True
        greedy_text = lm.greedy([tok.encode(context)], 1, [])
    pairs = [("The cat sat on the", " mat"), ("Question: Which planet do we live on?\nAnswer: ", "Earth"),
             (long_context, " The dog did not move."), ("", "Hello world"), (context, greedy_text[0]),
             ("for x in", " range(10):")]
    got = lm.loglikelihood(requests("loglikelihood", pairs))
    want = [direct(model, tok, c, x) for c, x in pairs]
    for (c, x), (lp, greedy), (want_lp, want_greedy) in zip(pairs, got, want, strict=True):
        assert lp == pytest.approx(want_lp, abs=1e-4, rel=1e-5), (c[:30], x)
        assert greedy == want_greedy, (c[:30], x)
    assert got[4][1] and not all(g for _, g in got)
    # Whitespace at the end of the context is scored as part of the continuation.
    assert got[1][0] == pytest.approx(direct(model, tok, "Question: Which planet do we live on?\nAnswer:", " Earth")[0],
                                      abs=1e-4)
    # Rolling: one text longer than two windows is the sum of disjoint windows' log-likelihoods.
    (rolling,) = lm.loglikelihood_rolling(requests("loglikelihood_rolling", [(long_context,)]))
    ids = tok.encode(long_context)
    with torch.no_grad():
        total = 0.0
        first = [tok.eos_id, *ids[:SEQ_LEN - 1]]
        total += float(model(torch.tensor([first]))[0].double().log_softmax(-1)[torch.arange(SEQ_LEN),
                                                                                  torch.tensor(ids[:SEQ_LEN])].sum())
        done = SEQ_LEN
        while done < len(ids):
            end = min(done + SEQ_LEN, len(ids))
            window = ids[end - SEQ_LEN - 1 : end - 1]
            lp = model(torch.tensor([window]))[0].double().log_softmax(-1)
            n = end - done
            total += float(lp[torch.arange(SEQ_LEN - n, SEQ_LEN), torch.tensor(ids[done:end])].sum())
            done = end
    assert rolling == pytest.approx(total, abs=1e-3, rel=1e-5)


def test_generate_until_is_a_greedy_loop_that_stops_at_the_stop_string(trained, monkeypatch):
    model, tok = trained.model, trained.tokenizer
    lm = DiffsweepLM(model, tok, seq_len=SEQ_LEN, device=torch.device("cpu"), batch_size=3)
    steps = 12
    prompts = ["The value of the expression", "Return", "A function definition " * 20]

    def loop(prompt: str) -> str:  # argmax step by step, no stop string
        ids = tok.encode(prompt)[-(SEQ_LEN - steps):]
        new: list[int] = []
        with torch.no_grad():
            for _ in range(steps):
                token = int(model(torch.tensor([ids + new]))[0, -1].argmax())
                if token == tok.eos_id:
                    break
                new.append(token)
        return tok.decode(new)

    free = [loop(p) for p in prompts]
    got = lm.generate_until(requests("generate_until", [(p, {"until": ["\x00"], "max_gen_toks": steps,
                                                              "do_sample": False}) for p in prompts]))
    assert got == free
    # A stop string that the first continuation holds a few characters in: the text is cut before it,
    # and decoding stops there (fewer forward passes than a full run).
    stop = free[0][len(free[0]) // 2:][:2]
    assert stop and stop in free[0]
    calls = []
    forward = lm._forward
    monkeypatch.setattr(lm, "_forward", lambda rows: calls.append(len(rows)) or forward(rows))
    (cut,) = lm.generate_until(requests("generate_until", [(prompts[0], {"until": [stop], "max_gen_toks": steps})]))
    assert cut == free[0].split(stop)[0] and len(calls) < steps
    with pytest.raises(ConfigError, match=r"^downstream.tasks: a task generates up to 128 tokens"):
        lm.generate_until(requests("generate_until", [(prompts[0], {"until": ["."], "max_gen_toks": SEQ_LEN})]))


def test_accuracy_is_the_share_of_items_whose_gold_choice_scores_highest(trained, hf_cache):
    ctx = EvalContext(model=trained.model, config=trained.config, tokenizer=trained.tokenizer, val_tokens=None,
                      device=torch.device("cpu"), autocast_dtype=None, out_dir=hf_cache / "out")
    probe = DownstreamProbe()
    settings = DownstreamSettings(tasks=("diffsweep_tiny_qa", "diffsweep_tiny_complete"),
                                  include_path=str(TASKS), batch=4)
    probe.check(settings, trained.config)
    result = probe.run(ctx, settings)
    items = [json.loads(line) for line in (TASKS / "tiny_qa.jsonl").read_text().splitlines()]
    hits = hits_norm = 0
    for item in items:
        scores = [direct(trained.model, trained.tokenizer, f"Question: {item['question']}\nAnswer:", f" {c}")[0]
                  for c in item["choices"]]
        hits += max(range(len(scores)), key=scores.__getitem__) == item["label"]
        normed = [s / len(c) for s, c in zip(scores, item["choices"])]
        hits_norm += max(range(len(normed)), key=normed.__getitem__) == item["label"]
    m = result.metrics
    assert 0 <= m["downstream/diffsweep_tiny_qa/acc"] <= 1
    assert m["downstream/diffsweep_tiny_qa/acc"] == pytest.approx(hits / len(items))
    assert m["downstream/diffsweep_tiny_qa/acc_norm"] == pytest.approx(hits_norm / len(items))
    assert m["downstream/average"] == m["downstream/diffsweep_tiny_qa/acc"]  # the one task with an accuracy
    assert m["downstream/diffsweep_tiny_qa/acc_stderr"] > 0
    assert 0 <= m["downstream/diffsweep_tiny_complete/exact_match"] <= 1
    rows = {(r["task"], r["metric"]): r for r in result.tables["downstream"]}
    assert rows["diffsweep_tiny_qa", "acc"]["samples"] == len(items) == 16
    assert rows["diffsweep_tiny_complete", "exact_match"]["samples"] == 6
    limited = probe.run(ctx, DownstreamSettings(tasks=("diffsweep_tiny_qa",), include_path=str(TASKS), limit=4))
    assert limited.tables["downstream"][0]["samples"] == 4
    # One of the paper's tasks whose dataset is not in the (empty) cache: nothing is downloaded.
    with pytest.raises(EnvironmentUnavailable, match="nothing is downloaded while evaluating"):
        probe.run(ctx, DownstreamSettings(tasks=("arc_easy",), include_path=str(TASKS), limit=1))


@pytest.mark.slow
def test_quantization_runs_the_tasks_at_each_bit_width(trained, hf_cache):
    """Fig. 8's downstream half: at 16 bits the downstream probe's numbers exactly; at 4 bits the
    accuracy of the model scored directly with its attention logits quantized."""
    from diffsweep.eval.probe import get_probe, parse_settings
    from diffsweep.eval.tap import tapped

    ctx = EvalContext(model=trained.model, config=trained.config, tokenizer=trained.tokenizer,
                      val_tokens=trained.dataset.split("val"), device=torch.device("cpu"), autocast_dtype=None,
                      out_dir=hf_cache / "out")
    probe = get_probe("quantization")
    settings = parse_settings(probe, {"bits": [4], "tokens": SEQ_LEN, "micro_batch": 4,
                                      "tasks": ["diffsweep_tiny_qa"], "include_path": str(TASKS)})
    probe.check(settings, trained.config)
    result = probe.run(ctx, settings)
    plain = DownstreamProbe().run(ctx, DownstreamSettings(tasks=("diffsweep_tiny_qa",), include_path=str(TASKS),
                                                          batch=4))
    rows = {(r["bits"], r["metric"]): r for r in result.tables["quantization_downstream"]}
    assert {bits for bits, _ in rows} == {16, 4}
    for row in plain.tables["downstream"]:
        assert rows[16, row["metric"]]["value"] == row["value"] and rows[16, row["metric"]]["delta"] == 0
        assert rows[4, row["metric"]]["delta"] == rows[4, row["metric"]]["value"] - row["value"]
    m = result.metrics
    assert m["quantization/bits_16/diffsweep_tiny_qa/acc"] == plain.metrics["downstream/diffsweep_tiny_qa/acc"]
    assert m["quantization/bits_16/downstream_average"] == plain.metrics["downstream/average"]
    items = [json.loads(line) for line in (TASKS / "tiny_qa.jsonl").read_text().splitlines()]
    hits = 0
    with tapped(trained.model, bits=4):
        for item in items:
            scores = [direct(trained.model, trained.tokenizer, f"Question: {item['question']}\nAnswer:", f" {c}")[0]
                      for c in item["choices"]]
            hits += max(range(len(scores)), key=scores.__getitem__) == item["label"]
    assert m["quantization/bits_04/diffsweep_tiny_qa/acc"] == pytest.approx(hits / len(items))
    assert rows[4, "acc"]["value"] == pytest.approx(hits / len(items))
    # its task settings are checked as the downstream probe's, named by this probe's keys
    # (with TASKS as include_path, as above: its task index is built already; without one, lm-eval's own
    # index alone would be built for this check, ~11 CPU-s, and it lists the same lm-eval tasks)
    for items_, key in [({"tasks": ["arc_easyy"], "include_path": str(TASKS)}, "quantization.tasks"),
                        ({"limit": 3}, "quantization.tasks"),
                        ({"tasks": ["arc_easy"], "include_path": "/no/such/dir"}, "quantization.include_path"),
                        ({"tasks": ["arc_easy"], "micro_batch": 0}, "quantization.micro_batch")]:
        with pytest.raises(ConfigError) as caught:
            probe.check(parse_settings(probe, items_), trained.config)
        assert caught.value.key == key, items_


def test_bad_settings_and_a_missing_lm_eval_stop_before_anything_runs(trained, monkeypatch):
    probe = DownstreamProbe()
    with pytest.raises(ConfigError) as caught:
        probe.check(DownstreamSettings(tasks=("arc_easyy",), include_path=str(TASKS)), trained.config)
    assert caught.value.key == "downstream.tasks" and "close: [arc_easy," in str(caught.value)
    for items, key in [(["downstream.batch=0"], "downstream.batch"), (["downstream.tasks=[]"], "downstream.tasks"),
                       (["downstream.include_path=/no/such/dir"], "downstream.include_path")]:
        with pytest.raises(ConfigError) as caught:
            ((p, s),) = probe_requests(["downstream"], items)
            p.check(s, trained.config)
        assert caught.value.key == key, items
    monkeypatch.setitem(sys.modules, "lm_eval", None)  # as if not installed
    with pytest.raises(EnvironmentUnavailable, match=r"lm-eval.*pip install 'diffsweep\[lm-eval\]'"):
        probe.check(DownstreamSettings(), trained.config)


def test_the_probe_through_the_cli(trained_run, tmp_path, mlflow_store):
    args = ["eval", str(trained_run), "--probe", "downstream",
            "--probe-set", "downstream.tasks=[diffsweep_tiny_qa, diffsweep_tiny_complete]",
            "--probe-set", f"downstream.include_path={TASKS}", "--json"]
    env = {"MLFLOW_TRACKING_URI": mlflow_store, "HF_HOME": str(tmp_path / "hf")}
    r = cli(*args, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    (e,) = json.loads(r.stdout)
    assert e["probe"] == "downstream" and e["ran"]
    assert 0 <= e["metrics"]["downstream/diffsweep_tiny_qa/acc"] <= 1
    assert e["metrics"]["downstream/average"] == e["metrics"]["downstream/diffsweep_tiny_qa/acc"]
    assert {row["task"] for row in e["tables"]["downstream"]} == {"diffsweep_tiny_qa", "diffsweep_tiny_complete"}
    assert "it/s" not in r.stderr  # no progress bars
