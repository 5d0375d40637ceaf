"""The in-context learning probe (Fig. 6, Fig. 7): prompts as documented, constrained decoding equal
to a direct log-likelihood argmax, accuracy as the fraction right, permutations of one multiset,
shots that do not fit skipped, settings errors by key, and a whole run on a trained model."""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from diffsweep.config import ConfigError
from diffsweep.eval.probe import EvalContext, get_probe, parse_settings
from diffsweep.eval.probes import icl

# The session's trained run is trained once, by the worker of test_runner and test_downstream.
pytestmark = pytest.mark.xdist_group("trained_run")

DATA = Path(__file__).parent / "data" / "topics.jsonl"  # 48 sentences, 4 topics x 12, written for these tests
TINY = {"data": str(DATA), "shots": [1, 2, 4], "queries": 12, "permutations": 4, "seeds": 2, "batch": 16}


@pytest.fixture(scope="module")
def ctx(trained_run, tmp_path_factory) -> EvalContext:
    """The trained run's model, allowed prompts of 512 tokens (it trained on 128; with the 512-token
    BPE a demonstration is ~50 tokens, and RoPE has no length limit): 4 shots fit."""
    from diffsweep.eval.loading import load_trained

    t = load_trained(trained_run, device=torch.device("cpu"))
    config = dataclasses.replace(t.config, train=dataclasses.replace(t.config.train, seq_len=512))
    return EvalContext(model=t.model, config=config, tokenizer=t.tokenizer, val_tokens=t.dataset.split("val"),
                       device=t.device, autocast_dtype=t.autocast_dtype, out_dir=tmp_path_factory.mktemp("icl"),
                       seed=t.config.train.seed)


def _settings(**items):
    probe = get_probe("icl")
    return probe, parse_settings(probe, {**TINY, **items})


def _direct_scores(ctx, prompt_text: str, labels: list[str]) -> list[float]:
    """Each label's total log-likelihood after the prompt, one unpadded forward per label."""
    out = []
    for label in labels:
        p, c = ctx.tokenizer.encode(prompt_text), ctx.tokenizer.encode(" " + label)
        with torch.no_grad():
            logp = torch.log_softmax(ctx.model(torch.tensor([p + c[:-1]])).float(), -1)[0]
        out.append(sum(float(logp[len(p) - 1 + i, tok]) for i, tok in enumerate(c)))
    return out


def test_prompts_and_draws_are_as_documented(ctx):
    examples = icl.load_examples(DATA)
    assert len(examples) == 48 and icl.labels_of(examples) == ["food", "music", "sports", "weather"]
    queries, pool = icl.split(examples, 12, ctx.seed)
    assert len(queries) == 12 and len(pool) == 36 and not set(queries) & set(pool)
    assert (queries, pool) == icl.split(examples, 12, ctx.seed) and queries != icl.split(examples, 12, ctx.seed + 1)[0]
    demos = icl.pool_order(pool, ctx.seed, 0)[:2]
    text = icl.prompt(demos, queries[0])
    assert text == (f"Input: {demos[0].text}\nLabel: {demos[0].label}\n\n"
                    f"Input: {demos[1].text}\nLabel: {demos[1].label}\n\n"
                    f"Input: {queries[0].text}\nLabel:")
    task = icl.Task(ctx, queries, pool, icl.labels_of(examples), [], 4)
    assert ctx.tokenizer.decode(task.prompts(demos)[0]) == text
    # a seed's k-shot sets grow by adding demonstrations; seeds differ
    orders = [icl.pool_order(pool, ctx.seed, s) for s in range(2)]
    assert sorted(orders[0], key=str) == sorted(pool, key=str) and orders[0] != orders[1]
    # the robustness set is balanced; alternate takes turns, grouped sorts by class
    robust = icl.balanced(pool, 8, ctx.seed)
    assert Counter(d.label for d in robust) == dict.fromkeys(["food", "music", "sports", "weather"], 2)
    classes = icl.labels_of(robust)
    assert [d.label for d in icl.alternate(robust, classes)] == classes * 2
    assert [d.label for d in icl.grouped(robust, classes)] == [c for c in classes for _ in range(2)]
    assert sorted(icl.alternate(robust, classes), key=str) == sorted(robust, key=str)


def test_permutations_are_distinct_orders():
    drawn = icl.orders(5, 10, seed=3)
    assert len(drawn) == 10 == len(set(drawn)) and all(sorted(o) == list(range(5)) for o in drawn)
    assert drawn == icl.orders(5, 10, seed=3) and drawn != icl.orders(5, 10, seed=4)
    every = icl.orders(3, 10, seed=0)  # 3! = 6 < 10: every order once
    assert len(every) == 6 == len(set(every)) == math.factorial(3)


@pytest.mark.parametrize("model", ["trained", "random"])
def test_constrained_decoding_is_the_argmax_of_the_direct_log_likelihood(ctx, model):
    if model == "random":  # noisy logits (init std 1): predictions differ between queries
        from diffsweep.model.transformer import build_model

        torch.manual_seed(2)  # a seed whose 12 predictions are not all one label (seed 1 gave 'food' x 12)
        ctx = dataclasses.replace(ctx, model=build_model(dataclasses.replace(ctx.config.model, init_std=1.0)).eval())
    examples = icl.load_examples(DATA)
    labels = icl.labels_of(examples)
    queries, pool = icl.split(examples, 12, ctx.seed)
    demos = icl.pool_order(pool, ctx.seed, 1)[:2]
    continuations = [ctx.tokenizer.encode(" " + a) for a in labels]
    assert any(len(c) > 1 for c in continuations)  # a label of several tokens: the sum is over all of them
    task = icl.Task(ctx, queries, pool, labels, continuations, batch=3)  # chunks cut across queries
    prompts = task.prompts(demos)
    scores = icl.label_log_likelihoods(ctx, prompts, continuations, batch=3)
    direct = [_direct_scores(ctx, icl.prompt(demos, q), labels) for q in queries]
    assert scores.shape == (12, 4)
    np.testing.assert_allclose(scores, direct, atol=1e-4, rtol=0)
    predicted = [labels[int(np.argmax(s))] for s in direct]
    assert task.predict(prompts) == predicted
    assert task.accuracy(prompts) == sum(p == q.label for p, q in zip(predicted, queries, strict=True)) / 12
    if model == "random":
        assert len(set(predicted)) > 1, predicted


def test_a_run_on_a_trained_model(ctx):
    probe, settings = _settings()
    result = probe.run(ctx, settings)
    m = result.metrics
    assert set(m) == {"icl/shots_01/accuracy", "icl/shots_02/accuracy", "icl/shots_04/accuracy", "icl/robust/shots",
                      "icl/robust/mean", "icl/robust/std", "icl/robust/best", "icl/robust/worst",
                      "icl/robust/margin", "icl/robust/grouped", "icl/robust/alternate"}, result.notes
    rows = result.tables["icl_shots"]
    assert [(r["shots"], r["seed"]) for r in rows] == [(k, s) for k in (1, 2, 4) for s in range(2)]
    for k in (1, 2, 4):
        assert m[f"icl/shots_{k:02d}/accuracy"] == pytest.approx(sum(r["accuracy"] for r in rows if r["shots"] == k) / 2)
        assert result.series["icl/accuracy_by_shots"][k] == m[f"icl/shots_{k:02d}/accuracy"]
    # one cell recomputed by the test: the fraction of queries whose direct argmax is the label
    examples = icl.load_examples(DATA)
    labels = icl.labels_of(examples)
    queries, pool = icl.split(examples, 12, ctx.seed)
    demos = icl.pool_order(pool, ctx.seed, 1)[:4]
    right = 0
    for q in queries:
        s = _direct_scores(ctx, icl.prompt(demos, q), labels)
        right += labels[max(range(4), key=s.__getitem__)] == q.label
    assert [r["accuracy"] for r in rows if (r["shots"], r["seed"]) == (4, 1)] == [right / 12]
    # robustness: 4 random orders of one balanced multiset of the largest fitting shot count, and 2 arrangements
    perm = result.tables["icl_permutations"]
    assert [r["arrangement"] for r in perm] == ["random"] * 4 + ["alternate", "grouped"]
    assert m["icl/robust/shots"] == 4 and all(r["shots"] == 4 for r in perm)
    assert all(Counter(r["labels"]) == Counter(perm[0]["labels"]) for r in perm)
    assert perm[-1]["labels"] == sorted(perm[0]["labels"])
    accs = [r["accuracy"] for r in perm[:4]]
    assert m["icl/robust/best"] == max(accs) and m["icl/robust/worst"] == min(accs)
    assert m["icl/robust/margin"] == pytest.approx(max(accs) - min(accs))
    assert m["icl/robust/mean"] == pytest.approx(sum(accs) / 4)
    assert m["icl/robust/std"] == pytest.approx(float(torch.tensor(accs).std(unbiased=False)))
    assert (m["icl/robust/alternate"], m["icl/robust/grouped"]) == (perm[4]["accuracy"], perm[5]["accuracy"])
    assert all(0 <= v <= 1 for k, v in m.items() if k != "icl/robust/shots")
    assert [p.name for p in result.files] == ["icl.png"] and result.files[0].stat().st_size > 1000
    assert result.notes == []
    again = probe.run(ctx, settings)  # deterministic for a seed
    assert again.metrics == m and again.tables == result.tables


def test_shots_that_do_not_fit_are_skipped(ctx):
    examples = icl.load_examples(DATA)
    labels = icl.labels_of(examples)
    queries, pool = icl.split(examples, 12, ctx.seed)
    task = icl.Task(ctx, queries, pool, labels, [ctx.tokenizer.encode(" " + a) for a in labels], 16)
    longest = max(task.longest(task.prompts(icl.pool_order(pool, ctx.seed, s)[:2])) for s in range(2))
    config = dataclasses.replace(ctx.config, train=dataclasses.replace(ctx.config.train, seq_len=longest))
    short = dataclasses.replace(ctx, config=config)
    probe, settings = _settings(permutations=2)
    result = probe.run(short, settings)
    assert sorted(k for k in result.metrics if k.startswith("icl/shots_")) == ["icl/shots_01/accuracy",
                                                                                "icl/shots_02/accuracy"]
    assert result.notes[0].startswith("4 shots skipped: the longest prompt with its label is ")
    assert result.metrics["icl/robust/shots"] <= 2
    tiny = dataclasses.replace(ctx, config=dataclasses.replace(config, train=dataclasses.replace(config.train,
                                                                                                  seq_len=8)))
    with pytest.raises(ConfigError, match="no shot count") as err:
        probe.run(tiny, settings)
    assert err.value.key == "icl.shots"


def test_settings_errors(ctx, tmp_path):
    def check(key, **items):
        probe = get_probe("icl")
        with pytest.raises(ConfigError) as err:
            probe.check(parse_settings(probe, {**TINY, **items}), ctx.config)
        assert err.value.key == f"icl.{key}"
        return str(err.value)

    assert "JSONL" in check("data", data="")
    assert "not found" in check("data", data=str(tmp_path / "missing.jsonl"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "a", "label": "x"}\n{"text": "b", "label": \n')
    assert f"{bad}:2" in check("data", data=str(bad))
    bad.write_text('{"text": "a", "label": "x"}\n{"text": "b", "label": "y"}\n{"text": "c", "label": 3}\n')
    assert f"{bad}:3" in check("data", data=str(bad))
    bad.write_text('{"text": "a", "label": "x"}\n{"text": "b", "label": "x"}\n')
    assert "2 distinct labels" in check("data", data=str(bad))
    assert "no demonstrations" in check("queries", queries=48)
    check("queries", queries=0)
    check("shots", shots=[0, 2])
    assert "more than the 36 examples" in check("shots", shots=[1, 40])
    check("robust_shots", robust_shots=37)
    check("permutations", permutations=0)
    check("batch", batch=0)
    with pytest.raises(ConfigError) as err:
        parse_settings(get_probe("icl"), {"shot": 3})
    assert err.value.key == "icl.shot"
