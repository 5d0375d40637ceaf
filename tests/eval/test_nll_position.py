"""The NLL-by-position probe (Fig. 4): its mean is the validation loss of the same windows, the
cumulative curve is the running mean, and a RoPE θ override changes the numbers but not the model."""

from __future__ import annotations

import pydoc_data.topics

import numpy as np
import pytest
import torch

from diffsweep.config import ConfigError, load_config
from diffsweep.data.dataset import val_starts, windows
from diffsweep.data.tokenizers import BytesTokenizer
from diffsweep.eval.probe import EvalContext, get_probe, parse_settings
from diffsweep.train.probes import token_losses

TEXT = "\n".join(pydoc_data.topics.topics.values())[:20000]


@pytest.fixture(scope="module")
def ctx(tmp_path_factory) -> EvalContext:
    config = load_config(None, ["model.size=tiny-xs", "model.vocab_size=256", "model.attention.kind=diff_v2",
                                "model.attention.backend=sdpa", "model.init_std=0.1", "train.seq_len=128"])
    torch.manual_seed(0)
    from diffsweep.model.transformer import build_model

    model = build_model(config.model).eval()
    tok = BytesTokenizer()
    return EvalContext(model=model, config=config, tokenizer=tok, val_tokens=np.array(tok.encode(TEXT), np.uint16),
                       device=torch.device("cpu"), autocast_dtype=None, out_dir=tmp_path_factory.mktemp("nll"))


def _run(ctx, **items):
    probe = get_probe("nll_position")
    settings = parse_settings(probe, {"documents": 10, "micro_batch": 4, **items})
    probe.check(settings, ctx.config)
    return probe.run(ctx, settings)


def test_mean_is_the_validation_loss(ctx):
    result = _run(ctx)
    per = result.series["nll_position/per_position"]
    cum = result.series["nll_position/cumulative"]
    assert list(per) == list(range(1, 129)) == list(cum)
    starts = val_starts(len(ctx.val_tokens), 128, 10 * 128)
    assert len(starts) == 10
    with torch.no_grad():
        direct = token_losses(ctx.model, torch.from_numpy(windows(ctx.val_tokens, starts, 128))).double()
    assert result.metrics["nll_position/mean"] == pytest.approx(float(direct.mean()), abs=1e-6)
    assert np.mean(list(per.values())) == pytest.approx(float(direct.mean()), abs=1e-6)
    np.testing.assert_allclose(list(per.values()), direct.mean(0).numpy(), atol=1e-6)
    for t in (1, 7, 50, 128):
        assert cum[t] == pytest.approx(np.mean([per[s] for s in range(1, t + 1)]), abs=1e-9)
    assert result.metrics["nll_position/last_tenth"] == pytest.approx(np.mean([per[t] for t in range(116, 129)]))
    rows = result.tables["nll_position"]
    assert [r["position"] for r in rows] == [1, 2, 4, 8, 16, 32, 64, 128]
    assert all(r["nll"] == per[r["position"]] and r["cumulative"] == cum[r["position"]] for r in rows)
    assert [p.name for p in result.files] == ["nll_position.png"] and result.files[0].stat().st_size > 1000


def test_rope_theta_override_does_not_leak(ctx):
    tokens = torch.from_numpy(windows(ctx.val_tokens, np.array([5]), 128))[:, :-1]
    with torch.no_grad():
        before = ctx.model(tokens)
    tables, cfg = ctx.model._rope, ctx.model.cfg
    base = _run(ctx)
    other = _run(ctx, rope_theta=100.0)
    assert other.metrics["nll_position/mean"] != pytest.approx(base.metrics["nll_position/mean"], abs=1e-4)
    assert other.series["nll_position/per_position"][1] == pytest.approx(base.series["nll_position/per_position"][1])
    assert ctx.model._rope is tables and ctx.model.cfg is cfg
    with torch.no_grad():
        assert torch.equal(ctx.model(tokens), before)
    assert _run(ctx).metrics == base.metrics


def test_shorter_context_and_errors(ctx):
    result = _run(ctx, context=32, documents=3)
    assert len(result.series["nll_position/cumulative"]) == 32
    with pytest.raises(ConfigError, match="positive RoPE base") as err:
        _run(ctx, rope_theta=0.0)
    assert err.value.key == "nll_position.rope_theta"
    with pytest.raises(ConfigError, match="fewer than one window") as err:
        _run(ctx, context=30000)
    assert err.value.key == "nll_position.context"


def test_documents_capped_by_the_split_are_said(ctx):
    available = (len(ctx.val_tokens) - 1) // 128
    capped = _run(ctx, documents=available + 50, micro_batch=64).capped["documents"]
    assert (capped.asked, capped.used) == (available + 50, available)
    assert "the validation split has" in capped.why
    assert _run(ctx, documents=available).capped == {}
