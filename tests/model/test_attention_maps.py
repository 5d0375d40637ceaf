"""``AttentionModule.attention_maps``: the map each output head applies to V.

For each kind (float64, random weights, GQA), ``map @ V`` with the head's own V (computed here from
``project``'s outputs, expanded to the query heads by this file's own indexing) reproduces the
module's ``core`` with the per-head norm off; maps are causal; standard rows sum to 1, DIFF V2 rows
to 1 − λ_i(t) (any pairing), DIFF V1 rows to 1 − λ.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from diffsweep.config import ConfigWarning, load_config
from diffsweep.model.transformer import build_model

torch.set_num_threads(1)

B, T = 2, 10
TOL = 1e-12


def build(*overrides: str):
    """A float64 tiny-xs model with random weights (larger than the init, so maps are not uniform)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConfigWarning)  # cross_group with one KV head
        cfg = load_config(None, ["model.size=tiny-xs", "model.vocab_size=64", "model.attention.backend=sdpa",
                                 *overrides]).model
    model = build_model(cfg).double().eval()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float64)
            p.copy_(1.0 + 0.2 * noise if name.endswith("norm.weight") else 0.3 * noise)
    return model


def layer_input(model):
    """The first block's attention module, its normalised input x and RoPE tables."""
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(B, T, model.cfg.d_model, generator=gen, dtype=torch.float64)
    block = model.blocks()[0]
    return block.attention, block.attention_norm(x), model.rope(T, x.device)


def per_query_head(v: torch.Tensor, num_q: int) -> torch.Tensor:
    """V ``(B, Hkv, T, Dv)`` as seen by each of ``num_q`` query heads (head j reads group j // (num_q / Hkv))."""
    group = num_q // v.shape[1]
    return torch.stack([v[:, j // group] for j in range(num_q)], dim=1)


def heads_out(core_out: torch.Tensor, h: int) -> torch.Tensor:
    """``core``'s ``(B, T, h * Dv)`` as ``(B, h, T, Dv)``."""
    return core_out.view(B, T, h, -1).transpose(1, 2)


CASES = {
    "transformer": ["model.attention.kind=transformer", "model.attention.num_kv_heads=2"],
    "transformer_head_norm": ["model.attention.kind=transformer", "model.attention.num_kv_heads=2",
                              "model.attention.head_norm=rmsnorm"],
    "diff_v1": ["model.attention.kind=diff_v1", "model.attention.num_kv_heads=1"],
    "diff_v2": ["model.attention.kind=diff_v2", "model.attention.num_kv_heads=2"],
    "diff_v2_cross_group": ["model.attention.kind=diff_v2", "model.attention.num_kv_heads=1",
                            "model.attention.v2_pairing=cross_group"],
    "diff_v2_no_lambda": ["model.attention.kind=diff_v2", "model.attention.num_kv_heads=2",
                          "model.attention.v2_lambda=none"],
}


@pytest.mark.parametrize("case", list(CASES))
@torch.no_grad()
def test_map_times_v_is_the_attention_output(case):
    model = build(*CASES[case])
    attention, x, rope = layer_input(model)
    h = attention.num_heads
    assert attention.num_kv_heads < (2 * h if "diff_v2" in case else h)  # GQA
    maps = attention.attention_maps(x, rope)
    assert maps.shape == (B, h, T, T) and maps.dtype == torch.float64
    assert (maps.triu(1) == 0).all()  # causal

    inputs = attention.project(x, rope)
    v = inputs[-1] if case == "diff_v1" else inputs[2]  # V1: (q1, k1, q2, k2, v); V2: (q, k, v[, λ])
    num_q = 2 * h if "diff_v2" in case else h
    v_heads = per_query_head(v, num_q)  # (B, num_q, T, Dv)
    if "diff_v2" in case:  # output head i reads the V of query head 2i (same_group) or i (cross_group)
        v_heads = v_heads[:, :h] if "cross_group" in case else v_heads[:, 0::2]
    expected = maps @ v_heads  # (B, h, T, Dv)

    norm = getattr(attention, "head_norm", None)
    if norm is not None:  # the map is the same with or without the per-head norm
        attention.head_norm = None
        without_norm = attention.attention_maps(x, rope)
        assert torch.equal(without_norm, maps)
    actual = heads_out(attention.core(*inputs), h)
    assert (actual - expected).abs().max() <= TOL * expected.abs().max()

    rows = maps.sum(-1)  # (B, h, T)
    if case.startswith("transformer"):
        assert torch.allclose(rows, torch.ones_like(rows), atol=1e-12)
        assert (maps >= 0).all()
    elif case == "diff_v1":
        lam = float(attention.lambda_full())
        assert torch.allclose(rows, torch.full_like(rows, 1 - lam), atol=1e-12)
    else:
        lam = attention.lambda_values(x)
        lam = torch.ones(B, T, h, dtype=torch.float64) if lam is None else lam
        assert torch.allclose(rows, 1 - lam.transpose(1, 2), atol=1e-12)


@torch.no_grad()
def test_cross_group_map_with_several_kv_heads():
    """cross_group with h_kv > 1: heads i and h+i read different K/V heads; the map is still the
    difference of their softmax maps (rows sum to 1 − λ), causal."""
    model = build("model.attention.kind=diff_v2", "model.attention.num_kv_heads=2",
                  "model.attention.v2_pairing=cross_group")
    attention, x, rope = layer_input(model)
    h = attention.num_heads
    maps = attention.attention_maps(x, rope)
    q, k, _, _ = attention.project(x, rope)
    k = per_query_head(k, 2 * h)
    scores = (q @ k.transpose(-1, -2)) * attention.head_dim**-0.5
    scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    probs = scores.softmax(-1)
    lam = attention.lambda_values(x).transpose(1, 2).unsqueeze(-1)
    assert torch.allclose(maps, probs[:, :h] - lam * probs[:, h:], atol=1e-12)
    assert (maps.triu(1) == 0).all()


@torch.no_grad()
def test_model_and_backend_unchanged():
    """``attention_maps`` leaves the module's backend in place and is deterministic."""
    model = build("model.attention.kind=diff_v1")
    attention, x, rope = layer_input(model)
    backend = attention.backend
    first = attention.attention_maps(x, rope)
    assert attention.backend is backend
    assert torch.equal(first, attention.attention_maps(x, rope))
