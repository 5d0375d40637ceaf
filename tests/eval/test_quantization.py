"""The quantization probe (Fig. 8): 16 bits is exactly (==) the validation loss computed here with
``token_losses`` and no tap, over the same windows and micro-batches; 12 bits stays within a small
tolerance of it; 4 bits moves it; the table, metrics, note and settings checks. (The quantizer
itself is checked on hand-made logits in ``test_tap.py``; losses need not grow as bits shrink.)"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from diffsweep.config import ConfigError, load_config
from diffsweep.eval.probe import EvalContext, get_probe, parse_settings
from diffsweep.train.probes import token_losses
from tests.eval.tiny import KINDS, tiny_context

torch.set_num_threads(1)

SEQ, WINDOWS, MICRO = 32, 5, 2


def context(kind: str, tmp_path) -> EvalContext:
    """Q/K weights wider than the init: attention far from uniform, so quantizing its logits matters."""
    return tiny_context(kind, tmp_path, seq=SEQ, tokens=WINDOWS * SEQ + 7, qk_std=0.5)


@torch.no_grad()
def plain_loss(ctx: EvalContext) -> float:
    """The validation loss without any tap: windows of SEQ + 1 tokens every SEQ tokens, MICRO at a time."""
    data = np.stack([ctx.val_tokens[s:s + SEQ + 1] for s in range(0, WINDOWS * SEQ, SEQ)]).astype(np.int64)
    total, count = 0.0, 0
    for i in range(0, WINDOWS, MICRO):
        losses = token_losses(ctx.model, torch.from_numpy(data[i:i + MICRO]))
        total += float(losses.double().sum())
        count += losses.numel()
    return total / count


@pytest.mark.parametrize("kind", list(KINDS))
def test_losses_by_bits(kind, tmp_path):
    ctx = context(kind, tmp_path)
    probe = get_probe("quantization")
    settings = parse_settings(probe, {"bits": [12, 8, 4], "tokens": WINDOWS * SEQ, "micro_batch": MICRO})
    probe.check(settings, ctx.config)
    result = probe.run(ctx, settings)
    loss = {row["bits"]: row["val_loss"] for row in result.tables["quantization"]}
    assert list(loss) == [16, 12, 8, 4]  # 16, the baseline, is always evaluated; widest first
    assert loss[16] == plain_loss(ctx)  # bit for bit: 16 bits is the run's own backend
    assert abs(loss[12] - loss[16]) < 1e-3
    assert loss[4] != loss[16] and abs(loss[4] - loss[16]) > abs(loss[12] - loss[16])
    for row in result.tables["quantization"]:
        assert row["delta"] == row["val_loss"] - loss[16]
        assert result.metrics[f"quantization/bits_{row['bits']:02d}/val_loss"] == row["val_loss"]
    assert len(result.metrics) == 4
    backend = ctx.model.cfg.attention.backend.value
    assert any("bits 12, 8, 4" in note and repr(backend) in note for note in result.notes)
    assert all(block.attention.backend.name.value == backend for block in ctx.model.blocks())  # restored


def test_only_16_bits_has_no_note(tmp_path):
    ctx = context("transformer", tmp_path)
    probe = get_probe("quantization")
    result = probe.run(ctx, parse_settings(probe, {"bits": [16], "tokens": SEQ, "micro_batch": 1}))
    assert result.notes == [] and list(result.metrics) == ["quantization/bits_16/val_loss"]


def test_settings_checked():
    probe = get_probe("quantization")
    config = load_config(None, ["model.size=tiny-xs"])
    assert parse_settings(probe, {}).bits == (16, 8, 6, 4)  # the paper's widths
    for items, key in (({"bits": [8, 1]}, "quantization.bits"), ({"bits": [17]}, "quantization.bits"),
                       ({"bits": []}, "quantization.bits"), ({"tokens": 0}, "quantization.tokens"),
                       ({"micro_batch": -1}, "quantization.micro_batch")):
        with pytest.raises(ConfigError) as err:
            probe.check(parse_settings(probe, items), config)
        assert err.value.key == key


@pytest.mark.parametrize("granularity", ["tensor", "head", "row"])
def test_16_bits_is_the_untouched_model_at_every_granularity(granularity, tmp_path):
    """Only the quantized widths depend on the granularity; 16 bits stays bit for bit the model's
    own loss, and the granularity is in every table row."""
    ctx = context("diff_v2", tmp_path)
    probe = get_probe("quantization")
    settings = parse_settings(probe, {"bits": [16, 4], "tokens": WINDOWS * SEQ, "micro_batch": MICRO,
                                      "granularity": granularity})
    result = probe.run(ctx, settings)
    rows = {row["bits"]: row for row in result.tables["quantization"]}
    assert rows[16]["val_loss"] == plain_loss(ctx)
    assert {row["granularity"] for row in rows.values()} == {granularity}
    assert probe.headline_metric(settings) == "quantization/bits_04/val_loss" in result.metrics


def test_the_granularity_changes_the_4_bit_loss(tmp_path):
    ctx = context("transformer", tmp_path)
    probe = get_probe("quantization")
    loss = {}
    for granularity in ("tensor", "head", "row"):
        settings = parse_settings(probe, {"bits": [4], "tokens": WINDOWS * SEQ, "micro_batch": MICRO,
                                          "granularity": granularity})
        loss[granularity] = probe.run(ctx, settings).metrics["quantization/bits_04/val_loss"]
    assert len(set(loss.values())) == 3, loss


def test_granularity_is_a_closed_choice():
    probe = get_probe("quantization")
    assert parse_settings(probe, {}).granularity.value == "head"  # the default docs/eval.md justifies
    with pytest.raises(ConfigError) as err:
        parse_settings(probe, {"granularity": "channel"})
    assert err.value.key == "quantization.granularity"
    assert all(name in err.value.message for name in ("tensor", "head", "row")), err.value.message


def test_capped_by_a_short_validation_split(tmp_path):
    """More tokens than the split holds: the probe uses what there is and says so."""
    ctx = context("transformer", tmp_path)
    probe = get_probe("quantization")
    result = probe.run(ctx, parse_settings(probe, {"bits": [8], "tokens": 10 * WINDOWS * SEQ, "micro_batch": MICRO}))
    capped = result.capped["tokens"]
    assert (capped.asked, capped.used) == (10 * WINDOWS * SEQ, WINDOWS * SEQ)
    assert str(capped).startswith(f"{10 * WINDOWS * SEQ:,} asked, {WINDOWS * SEQ:,} used (the validation split has")
    exact = probe.run(ctx, parse_settings(probe, {"bits": [8], "tokens": WINDOWS * SEQ, "micro_batch": MICRO}))
    assert exact.capped == {}
