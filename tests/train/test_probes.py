"""Probes: the AR-Hit slice of the paper's Table 6 against its brute-force definition, the
validation loss sums, and ``probe`` (λ per layer, top-1 attention logit, top-1 hidden state)
checked against values computed independently here from the modules' weights and our own hooks."""

from __future__ import annotations

import math

import pytest
import torch
from torch.nn import functional as F

from diffsweep.config import load_config
from diffsweep.model.transformer import build_model
from diffsweep.train.probes import LossSums, ar_hit_mask, probe, token_losses

TINY = ["model.size=tiny-xs", "model.vocab_size=512"]
SEQ = 24


# --- AR-Hit ---------------------------------------------------------------------------------------


def _ar_hit_brute(window: list[int]) -> list[bool]:
    """Target t is a hit when the bigram (w[t], w[t+1]) occurred at an earlier position s < t."""
    return [
        any((window[s], window[s + 1]) == (window[t], window[t + 1]) for s in range(t))
        for t in range(len(window) - 1)
    ]


@pytest.mark.parametrize(
    "window,expected",
    [
        ([1, 2, 1, 2, 1, 2], [False, False, True, True, True]),
        ([7, 7, 7, 7], [False, True, True]),
        ([1, 2, 2, 1], [False, False, False]),  # (2, 1) is (1, 2) reversed: not a repeat
        ([3, 1, 4, 1, 5, 9, 2, 6, 1, 4], [False] * 7 + [False, True]),
        ([0, 100_000, 0, 100_000, 99_999], [False, False, True, False]),  # large ids: no key collisions
        ([5, 9], [False]),
    ],
)
def test_ar_hit_hand_made(window, expected):
    assert _ar_hit_brute(window) == expected  # the definition itself, on the same cases
    assert ar_hit_mask(torch.tensor([window])).tolist() == [expected]


def test_ar_hit_random_windows_match_brute_force():
    """Random windows over small and large vocabularies agree with the definition, row by row
    (rows do not see each other's bigrams)."""
    gen = torch.Generator().manual_seed(0)
    for vocab, length in ((3, 40), (8, 65), (50, 129), (100_288, 33)):
        windows = torch.randint(0, vocab, (6, length), generator=gen)
        mask = ar_hit_mask(windows)
        assert mask.shape == (6, length - 1) and mask.dtype == torch.bool
        assert mask.tolist() == [_ar_hit_brute(row) for row in windows.tolist()]
    assert ar_hit_mask(torch.tensor([[1, 2, 3], [1, 2, 3]])).tolist() == [[False, False], [False, False]]
    assert ar_hit_mask(torch.tensor([[1, 2, 1, 2]], dtype=torch.int32)).tolist() == [[False, False, True]]


# --- loss sums ------------------------------------------------------------------------------------


def test_loss_sums_are_token_weighted():
    """Means over tokens (not over batches), split by the hit mask, with the hit fraction."""
    sums = LossSums()
    sums.add(torch.tensor([[1.0, 2.0, 3.0]]), torch.tensor([[False, True, True]]))
    sums.add(torch.tensor([[10.0]]), torch.tensor([[False]]))
    m = sums.metrics()
    assert m == pytest.approx({"val/loss": 16 / 4, "val/loss_ar_hit": 5 / 2, "val/loss_others": 11 / 2,
                               "val/ar_hit_fraction": 2 / 4})


def test_loss_sums_without_hits_omit_the_hit_slice():
    sums = LossSums()
    sums.add(torch.tensor([[1.0, 3.0]], dtype=torch.bfloat16), torch.tensor([[False, False]]))
    assert sums.metrics() == {"val/loss": 2.0, "val/loss_others": 2.0, "val/ar_hit_fraction": 0.0}


def test_token_losses_are_per_target_cross_entropy():
    model = _model("transformer")
    window = torch.randint(0, 512, (2, SEQ + 1), generator=torch.Generator().manual_seed(1))
    losses = token_losses(model, window)
    assert losses.shape == (2, SEQ) and losses.dtype == torch.float32
    with torch.no_grad():
        logits = model(window[:, :-1])
    for b in range(2):
        for t in (0, SEQ - 1):
            expected = F.cross_entropy(logits[b, t][None], window[b, t + 1][None])
            torch.testing.assert_close(losses[b, t], expected)
    mean = F.cross_entropy(logits.flatten(0, 1), window[:, 1:].flatten())
    assert float(losses.detach().mean()) == pytest.approx(float(mean), rel=1e-6)


# --- probe ----------------------------------------------------------------------------------------


def _model(kind: str, *sets: str):
    cfg = load_config(None, [*TINY, f"model.attention.kind={kind}", *sets])
    torch.manual_seed(0)
    model = build_model(cfg.model)
    # Larger weights than the 0.02 init so logits and hidden states are far from zero and the
    # layers differ; λ vectors perturbed so each layer has its own λ.
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * (0.3 if p.ndim >= 2 else 0.2))
    return model


def _rope(x: torch.Tensor, theta: float) -> torch.Tensor:
    """RoPE as in LLaMA's reference code: channel pairs (2i, 2i+1) as complex numbers times
    e^{i·pos·theta^(-2i/d)} (fp64)."""
    T, d = x.shape[-2], x.shape[-1]
    freqs = theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = torch.outer(torch.arange(T, dtype=torch.float64), freqs)  # (T, d/2)
    rot = torch.polar(torch.ones_like(angles), angles)
    return torch.view_as_real(torch.view_as_complex(x.double().unflatten(-1, (-1, 2)).contiguous()) * rot).flatten(-2)


def _qk_pairs(kind: str, attention, x: torch.Tensor, theta: float):
    """(q, k) of every attention map of one layer, (T, d) each, from the module's weights and its
    documented head layout, after RoPE."""
    x = x.double()
    d, h, hkv = attention.head_dim, attention.num_heads, attention.num_kv_heads
    q_all = x @ attention.wq.weight.double().T  # (B, T, rows)
    k_all = x @ attention.wk.weight.double().T
    B, T = x.shape[:2]
    pairs = []
    if kind == "diff_v1":  # rows per head: [Q1 | Q2]; per group: [K1 | K2]; head i uses group i // (h / hkv)
        q = _rope(q_all.view(B, T, h, 2, d).permute(0, 2, 3, 1, 4), theta)  # (B, h, 2, T, d)
        k = _rope(k_all.view(B, T, hkv, 2, d).permute(0, 2, 3, 1, 4), theta)
        for i in range(h):
            for sub in (0, 1):
                pairs.append((q[:, i, sub], k[:, i // (h // hkv), sub]))
    else:
        num_q = 2 * h if kind == "diff_v2" else h
        q = _rope(q_all.view(B, T, num_q, d).transpose(1, 2), theta)
        k = _rope(k_all.view(B, T, hkv, d).transpose(1, 2), theta)
        for j in range(num_q):
            pairs.append((q[:, j], k[:, j // (num_q // hkv)]))
    return pairs


@torch.no_grad()
def _independent(model, kind: str, window: torch.Tensor) -> dict[str, object]:
    """Top-1 |q·k|/√d over causal pairs (and over all pairs, for contrast), top-1 |block output|,
    and each layer's attention input, from our own hooks."""
    inputs, outputs, handles = {}, {}, []
    for i, block in enumerate(model.layers):
        handles.append(block.attention.register_forward_pre_hook(
            lambda m, args, i=i: inputs.__setitem__(i, args[0].detach())))
        handles.append(block.register_forward_hook(lambda m, args, out, i=i: outputs.__setitem__(i, out.detach())))
    model(window[:, :-1])
    for handle in handles:
        handle.remove()
    T = window.shape[1] - 1
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    top_causal = top_all = 0.0
    for i, block in enumerate(model.layers):
        for q, k in _qk_pairs(kind, block.attention, inputs[i], model.cfg.rope_theta):
            logits = (q @ k.transpose(-1, -2)).abs() / math.sqrt(q.shape[-1])  # (B, T, T)
            top_causal = max(top_causal, float(logits[:, causal].max()))
            top_all = max(top_all, float(logits.max()))
    hidden = max(float(out.abs().max()) for out in outputs.values())
    return {"logit": top_causal, "logit_all_pairs": top_all, "hidden": hidden, "inputs": inputs}


KINDS = [
    ("transformer", []),
    ("transformer", ["model.attention.kv_group_size=2", "model.attention.backend=reference"]),
    ("diff_v1", []),
    ("diff_v1", ["model.attention.kv_group_size=2"]),
    ("diff_v2", []),
    ("diff_v2", ["model.attention.kv_group_size=2", "model.attention.backend=reference"]),
    ("diff_v2", ["model.attention.kv_group_size=2", "model.attention.v2_pairing=cross_group"]),
]


@pytest.fixture(scope="module")
def window() -> torch.Tensor:
    return torch.randint(0, 512, (2, SEQ + 1), generator=torch.Generator().manual_seed(2))


@pytest.mark.parametrize("kind,sets", KINDS, ids=["-".join([k, *(s.split("=")[1] for s in sets)]) for k, sets in KINDS])
def test_outliers_match_independent_computation(kind, sets):
    """attn_logit_top1 is the largest |q·k|/√d over causal pairs of every head, map and layer;
    hidden_top1 the largest |block output|."""
    model = _model(kind, *sets)
    masked = 0
    for seed in range(6):
        window = torch.randint(0, 512, (2, SEQ + 1), generator=torch.Generator().manual_seed(seed))
        got = probe(model, window)
        ref = _independent(model, kind, window)
        assert got["outliers/attn_logit_top1"] == pytest.approx(ref["logit"], rel=1e-5)
        assert got["outliers/hidden_top1"] == pytest.approx(ref["hidden"], rel=1e-6)
        assert got["outliers/attn_logit_top1"] > 1.0  # far from zero: the comparison is not vacuous
        masked += ref["logit_all_pairs"] > ref["logit"] * 1.01
    assert masked > 0  # on some windows the top pair is a future one: the causal mask is checked



def test_hidden_top1_is_over_every_block():
    """hidden_top1 is the maximum over all blocks, not the last one: with the last block's output
    projections damped, the first block holds the top value on some windows."""
    model = _model("diff_v2")
    with torch.no_grad():
        model.layers[-1].attention.wo.weight.mul_(0.01)
        model.layers[-1].feed_forward.w_down.weight.mul_(0.01)
    per_layer: list[float] = []
    handles = [b.register_forward_hook(lambda m, a, out: per_layer.append(float(out.abs().max())))
               for b in model.layers]
    first_wins = 0
    for seed in range(6):
        window = torch.randint(0, 512, (2, SEQ + 1), generator=torch.Generator().manual_seed(seed))
        per_layer.clear()
        with torch.no_grad():
            model(window[:, :-1])
        top = max(per_layer)
        first_wins += per_layer[0] > per_layer[-1]
        per_layer.clear()
        assert probe(model, window)["outliers/hidden_top1"] == top
    for handle in handles:
        handle.remove()
    assert first_wins > 0

def test_diff_v1_lambda_per_layer():
    """DIFF V1: one λ per layer (1-based keys), equal to the module's lambda_full()."""
    model = _model("diff_v1")
    got = probe(model, torch.randint(0, 512, (1, SEQ + 1)))
    lambdas = {k: v for k, v in got.items() if k.startswith("lambda/")}
    assert list(lambdas) == ["lambda/layer_01", "lambda/layer_02"]
    for i, block in enumerate(model.layers):
        assert lambdas[f"lambda/layer_{i + 1:02d}"] == float(block.attention.lambda_full().detach())
    assert lambdas["lambda/layer_01"] != lambdas["lambda/layer_02"]


@pytest.mark.parametrize("activation", ["sigmoid", "raw"])
def test_diff_v2_lambda_mean_std_per_layer(activation, window):
    """DIFF V2: mean and std of λ as applied, over batch, tokens and heads, per layer."""
    model = _model("diff_v2", f"model.attention.v2_lambda={activation}")
    got = probe(model, window)
    ref = _independent(model, "diff_v2", window)
    assert sorted(k for k in got if k.startswith("lambda/")) == [
        "lambda/layer_01/mean", "lambda/layer_01/std", "lambda/layer_02/mean", "lambda/layer_02/std"]
    for i, block in enumerate(model.layers):
        lam = ref["inputs"][i].double() @ block.attention.wlambda.weight.detach().double().T  # (B, T, h)
        if activation == "sigmoid":
            lam = torch.sigmoid(lam)
        assert got[f"lambda/layer_{i + 1:02d}/mean"] == pytest.approx(float(lam.mean()), rel=1e-5, abs=1e-7)
        assert got[f"lambda/layer_{i + 1:02d}/std"] == pytest.approx(float(lam.std()), rel=1e-5)
    if activation == "sigmoid":
        assert 0 < got["lambda/layer_01/mean"] < 1


def test_no_lambda_keys_without_lambda():
    """Transformer and V2 with v2_lambda=none report no λ."""
    for kind, sets in (("transformer", []), ("diff_v2", ["model.attention.v2_lambda=none"])):
        model = _model(kind, *sets)
        got = probe(model, torch.randint(0, 512, (1, SEQ + 1)))
        assert sorted(got) == ["outliers/attn_logit_top1", "outliers/hidden_top1"], kind


@pytest.mark.parametrize("kind", ["transformer", "diff_v1", "diff_v2"])
def test_probe_leaves_the_model_as_it_was(kind, window):
    """After probing: the original backends are back, no hooks remain, the model's output is
    bitwise the same, and a second probe reads the same values."""
    model = _model(kind)
    backends = [block.attention.backend for block in model.layers]
    with torch.no_grad():
        before = model(window[:, :-1])
    first = probe(model, window)
    assert [block.attention.backend for block in model.layers] == backends
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
    assert torch.is_grad_enabled()
    with torch.no_grad():
        after = model(window[:, :-1])
    assert torch.equal(before, after)
    assert probe(model, window) == first


def test_probe_restores_backends_when_the_forward_fails():
    """A forward pass that raises (a token id beyond the vocabulary) still restores the model."""
    model = _model("diff_v1")
    backends = [block.attention.backend for block in model.layers]
    with pytest.raises(IndexError):
        probe(model, torch.tensor([[1, 2, 600, 3]]))
    assert [block.attention.backend for block in model.layers] == backends
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
