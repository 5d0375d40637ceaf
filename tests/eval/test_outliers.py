"""The outliers probe (Table 5) against plain ``torch.topk`` / ``torch.median`` over values captured
here: hidden states with this file's forward hooks, attention logits computed here from each
module's ``project`` (head by head, K head j // (Hq / Hkv)), over the same validation windows in
the same micro-batches (3 of them). The median is defined as the lower median truncated to bfloat16
precision; the statistics' definitions are also checked on hand-made values."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from diffsweep.config import ConfigError, load_config
from diffsweep.eval.probe import EvalContext, get_probe, parse_settings
from diffsweep.eval.probes.outliers import AbsStats, OutliersProbe
from tests.eval.tiny import KINDS, tiny_context

torch.set_num_threads(1)

SEQ, WINDOWS, MICRO = 32, 5, 2


def context(kind: str, tmp_path) -> EvalContext:
    return tiny_context(kind, tmp_path, seq=SEQ, tokens=WINDOWS * SEQ + 20)


def truncate_bf16(x: torch.Tensor) -> float:
    """``x`` (fp32) with the low 16 bits of its float32 pattern cleared."""
    return float((x.float().view(torch.int32) & ~0xFFFF).view(torch.float32))


def own_logits(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    group = q.shape[1] // k.shape[1]
    heads = [q[:, j].float() @ k[:, j // group].float().transpose(-1, -2) for j in range(q.shape[1])]
    return torch.stack(heads, dim=1) * q.shape[-1] ** -0.5


@torch.no_grad()
def captured(ctx: EvalContext, kind: str):
    """Per layer: all |attention logits| at causal positions and all |hidden states|, 1-D."""
    blocks = ctx.model.blocks()
    logits: list[list[torch.Tensor]] = [[] for _ in blocks]
    hidden: list[list[torch.Tensor]] = [[] for _ in blocks]
    causal = torch.ones(SEQ, SEQ, dtype=torch.bool).tril()

    def pre_hook(i):
        def hook(module, inputs):
            projected = module.project(inputs[0], ctx.model.rope(SEQ, inputs[0].device))
            pairs = [projected[0:2], projected[2:4]] if kind == "diff_v1" else [projected[0:2]]
            for q, k in pairs:
                logits[i].append(own_logits(q, k)[:, :, causal].abs().flatten())
        return hook

    def hook(i):
        return lambda module, inputs, output: hidden[i].append(output.abs().flatten())

    handles = [b.attention.register_forward_pre_hook(pre_hook(i)) for i, b in enumerate(blocks)]
    handles += [b.register_forward_hook(hook(i)) for i, b in enumerate(blocks)]
    data = np.stack([ctx.val_tokens[s:s + SEQ + 1] for s in range(0, WINDOWS * SEQ, SEQ)]).astype(np.int64)
    for i in range(0, WINDOWS, MICRO):  # the probe's micro-batches: 2, 2, 1 windows
        ctx.model(torch.from_numpy(data[i:i + MICRO, :-1]))
    for h in handles:
        h.remove()
    return {"attn_logit": [torch.cat(x) for x in logits], "hidden": [torch.cat(x) for x in hidden]}


def expected_row(values: torch.Tensor) -> dict[str, float]:
    top = values.topk(100).values
    return {**{f"top{k}": float(top[k - 1]) for k in (1, 2, 3, 10, 100)},
            "median": truncate_bf16(values.median())}


@pytest.mark.parametrize("kind", list(KINDS))
def test_probe_equals_plain_topk_and_median(kind, tmp_path):
    ctx = context(kind, tmp_path)
    probe = get_probe("outliers")
    settings = parse_settings(probe, {"tokens": WINDOWS * SEQ, "micro_batch": MICRO})
    result = probe.run(ctx, settings)
    values = captured(ctx, kind)
    assert len(values["attn_logit"][0]) == WINDOWS * {"transformer": 4, "diff_v1": 4, "diff_v2": 8}[kind] * SEQ * (SEQ + 1) // 2

    rows = {(row["what"], row["layer"]): row for row in result.tables["outliers"]}
    assert list(rows) == [(w, layer) for w in ("attn_logit", "hidden") for layer in ("all", 1, 2)]
    for what, per_layer in values.items():
        for layer, layer_values in [("all", torch.cat(per_layer)), *enumerate(per_layer, start=1)]:
            want = expected_row(layer_values)
            assert {k: v for k, v in rows[what, layer].items() if k not in ("what", "layer")} == want
            prefix = f"outliers/{what}" + ("" if layer == "all" else f"/layer_{layer:02d}")
            assert {k: result.metrics[f"{prefix}/{k}"] for k in want} == want
        # The truncated median is within 2^-7 below the exact one.
        exact = float(torch.cat(per_layer).median())
        assert exact * (1 - 2**-7) <= result.metrics[f"outliers/{what}/median"] <= exact
    assert len(result.metrics) == 2 * 3 * 6


def test_stats_definitions_on_hand_made_values():
    stats = AbsStats()
    stats.add(torch.tensor([1.0, -3.0, 2.0]))
    stats.add(torch.tensor([[1.0 + 2**-8], [-3.0]]))  # a second batch; -3 repeats the top value
    # sorted |values|: 1, 1.0039, 2, 3, 3; lower median (rank 2) = 2
    assert [stats.top_k(k) for k in (1, 2, 3, 4, 5, 6)] == [3.0, 3.0, 2.0, 1.0 + 2**-8, 1.0, None]
    assert stats.median() == 2.0 and stats.count == 5
    stats.add(torch.tensor([0.0]))  # six values: lower median is rank 2 -> 1.0039, truncated to bf16: 1.0
    assert stats.median() == 1.0
    other = AbsStats()
    other.add(torch.tensor([5.0, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1]))
    union = AbsStats.union([stats, other])
    assert union.count == 13 and union.top_k(1) == 5.0 and union.top_k(2) == 3.0
    # sorted: 0, 0.1 x 6, 1, 1.0039, 2, 3, 3, 5; rank 6 is 0.1, truncated: 0.099609375 (below 0.1)
    assert union.median() == truncate_bf16(torch.tensor(0.1)) == 0.099609375
    assert AbsStats().median() is None and AbsStats().top_k(1) is None


def test_settings_checked():
    probe = OutliersProbe()
    config = load_config(None, ["model.size=tiny-xs"])
    for items, key in (({"tokens": 0}, "outliers.tokens"), ({"micro_batch": 0}, "outliers.micro_batch")):
        with pytest.raises(ConfigError) as err:
            probe.check(parse_settings(probe, items), config)
        assert err.value.key == key
    assert parse_settings(probe, {}).tokens == 409_600  # the paper's 0.4M tokens
