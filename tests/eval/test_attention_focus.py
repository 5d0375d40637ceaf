"""The attention-focus probe (Table 3) against a direct computation: the test builds each layer's
maps itself from the module's ``project`` (softmax of q·kᵀ; DIFF V1's A1 − λA2), finds the answer
needle and the context by searching the prompt's tokens, and applies the definition."""

from __future__ import annotations

import pydoc_data.topics

import pytest
import torch

from diffsweep.config import ConfigError, load_config
from diffsweep.data.tokenizers import BytesTokenizer
from diffsweep.eval.needles import ANSWER_PREFIX, NEEDLE, needle_prompts, question
from diffsweep.eval.probe import EvalContext, get_probe, parse_settings
from diffsweep.model.transformer import build_model

torch.set_num_threads(1)
SEQ = 256
KINDS = {"transformer": ["model.attention.kind=transformer"],
         "diff_v1": ["model.attention.kind=diff_v1", "model.attention.num_kv_heads=1"]}
TEXT = "\n".join(list(pydoc_data.topics.topics.values())[:20])


def context(kind, tmp_path):
    import numpy as np

    config = load_config(None, ["model.size=tiny-xs", "model.vocab_size=256", f"train.seq_len={SEQ}", *KINDS[kind]])
    torch.manual_seed(0)
    model = build_model(config.model).eval()
    val = np.array(BytesTokenizer().encode(TEXT), dtype=np.uint16)
    return EvalContext(model=model, config=config, tokenizer=BytesTokenizer(), val_tokens=val,
                       device=torch.device("cpu"), autocast_dtype=None, out_dir=tmp_path)


def softmax_map(q, k, scale):
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    logits = (q.double() @ k.double().transpose(-1, -2)) * scale
    T = q.shape[2]
    logits = logits.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    return logits.softmax(-1)


def maps_by_hand(model, tokens):
    """Every layer's (B, h, T, T) maps, computed here from project's q and k."""
    found = []

    def hook(module, inputs):
        x = inputs[0]
        parts = module.project(x, model.rope(x.shape[1], x.device))
        d = module.head_dim
        if len(parts) == 3:  # transformer: q, k, v
            found.append(softmax_map(parts[0], parts[1], d**-0.5))
        else:  # DIFF V1: q1, k1, q2, k2, v
            lam = module.lambda_full().double()
            found.append(softmax_map(parts[0], parts[1], d**-0.5) - lam * softmax_map(parts[2], parts[3], d**-0.5))

    handles = [b.attention.register_forward_pre_hook(hook) for b in model.blocks()]
    with torch.no_grad():
        model(tokens)
    for h in handles:
        h.remove()
    return found


def find(tokens, ids):
    for i in range(len(tokens) - len(ids) + 1):
        if tokens[i:i + len(ids)] == ids:
            return i
    raise AssertionError("not found")


@pytest.mark.parametrize("kind", list(KINDS))
def test_answer_and_noise_equal_a_direct_computation(kind, tmp_path):
    ctx = context(kind, tmp_path)
    probe = get_probe("attention_focus")
    settings = parse_settings(probe, {"needles": 2, "depths": [0, 50, 100], "samples": 3, "batch": 2})
    probe.check(settings, ctx.config)
    result = probe.run(ctx, settings)
    tok = BytesTokenizer()
    for depth in (0, 50, 100):
        prompts = needle_prompts(ctx.val_tokens, tok, context=SEQ, needles=2, queries=1, depth=depth, samples=3)
        answers, noises = [], []
        for p in prompts:
            needle = tok.encode(NEEDLE.format(city=p.city, number=p.answer))
            start = find(p.tokens, needle)
            tail = len(tok.encode(question([p.city]) + ANSWER_PREFIX.format(city=p.city)))
            rows = len(tok.encode(ANSWER_PREFIX.format(city=p.city)))
            answer = torch.zeros(SEQ, dtype=torch.bool)
            answer[start:start + len(needle)] = True
            noise = torch.zeros(SEQ, dtype=torch.bool)
            noise[:SEQ - tail] = True
            noise &= ~answer
            for m in maps_by_hand(ctx.model, torch.tensor([p.tokens])):
                m = m[0, :, -rows:, :]
                m = m / m.abs().sum(-1, keepdim=True)
                answers.append(float((m * answer).sum(-1).mean()))
                noises.append(float((m.abs() * noise).sum(-1).mean()))
        assert result.metrics[f"attention_focus/depth_{depth}/answer"] == pytest.approx(sum(answers) / len(answers),
                                                                                          rel=1e-5, abs=1e-7)
        assert result.metrics[f"attention_focus/depth_{depth}/noise"] == pytest.approx(sum(noises) / len(noises),
                                                                                         rel=1e-5, abs=1e-7)
    if kind == "transformer":  # softmax rows: shares are in [0, 1] and answer + noise leaves the query's own share
        for row in result.tables["attention_focus"]:
            assert 0 < row["answer"] and 0 < row["noise"] and row["answer"] + row["noise"] < 1
    assert [r["depth"] for r in result.tables["attention_focus"]] == [0, 50, 100]


def test_settings_are_checked(tmp_path):
    ctx = context("transformer", tmp_path)
    probe = get_probe("attention_focus")
    for items, key in [({"context": SEQ + 1}, "attention_focus.context"), ({"depths": [120]}, "attention_focus.depths"),
                       ({"needles": 0}, "attention_focus.needles"), ({"samples": 0}, "attention_focus.samples"),
                       ({"batch": 0}, "attention_focus.batch"), ({"context": -5}, "attention_focus.context"),
                       ({"depths": []}, "attention_focus.depths")]:
        with pytest.raises(ConfigError) as caught:
            probe.check(parse_settings(probe, items), ctx.config)
        assert caught.value.key == key
    with pytest.raises(ConfigError, match="attention_focus.context"):  # no room for a haystack
        probe.run(ctx, parse_settings(probe, {"context": 40, "needles": 3, "depths": [0], "samples": 1}))
