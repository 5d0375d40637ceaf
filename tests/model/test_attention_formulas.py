"""Each attention kind equals its paper/blog formula, written out independently, head by head.

The expected values below are computed in float64 from the definitions in
``docs/references.md`` §2 (paper eq. 1-3 for DIFF V1, the V2 blog for DIFF V2, LLaMA-style
softmax attention for the baseline), with this file's own causal mask, softmax, RoPE
(interleaved pairs (2i, 2i+1), angle ``t * theta^(-2i/d)``) and RMSNorm. The module weights are
sliced per head exactly as each module's docstring documents its parameter layout. Nothing from
the project (reference kernels, ``Rotary``, ``RMSNorm``) is used to compute an expected value.

Precision: modules and expected values both run in float64 (the project's fp32 steps promote
instead of downcasting), so comparisons use a float64-level tolerance relative to the output's
magnitude; ``test_tolerance_detects_layout_errors`` shows that plausible layout mistakes (swapped
sub-heads, the wrong GQA group, rotate-half RoPE, no (1 - λ_init), λ without λ_init) miss by
many orders of magnitude more than that.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from diffsweep.config import Backend, ConfigWarning, load_config
from diffsweep.config.lambda_init import LambdaInit
from diffsweep.model.attention.backends import BACKENDS
from diffsweep.model.attention.diff_v1 import DiffAttentionV1
from diffsweep.model.attention.diff_v2 import DiffAttentionV2
from diffsweep.model.attention.standard import StandardAttention
from diffsweep.model.layers import Rotary
from diffsweep.model.transformer import build_model

torch.set_num_threads(1)

B, T, D = 2, 12, 64
# float64 resolution, relative to the largest |expected| value (measured errors ~1e-14;
# the layout errors checked below are >= 0.2 of it).
REL_TOL = 1e-10
BACKEND_NAMES = [Backend.REFERENCE, Backend.SDPA]


# ---------------------------------------------------------------------------------------------
# Helpers: configs, random weights


def model_cfg(*overrides: str):
    """A resolved ``ModelConfig`` from ``--set``-style overrides (d_model=64 unless overridden)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConfigWarning)  # e.g. cross_group with a single KV head
        return load_config(None, ["model.d_model=64", *overrides]).model


def randomize_(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Convert to float64 and give every parameter (λ vectors, norm gains too) random values;
    gradients are off (forward-only checks)."""
    module.double()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float64) * 0.3
            # Norm gains around 1 (non-trivial, but no near-zero channels); matrices around 0.
            p.copy_(1.0 + noise if name.endswith("norm.weight") else noise)
    return module.requires_grad_(False)


def random_input(seed: int, d_model: int = D) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1000 + seed)
    return torch.randn(B, T, d_model, generator=gen, dtype=torch.float64)


def run_module(cls, cfg, layer: int, backend_name: Backend, seed: int):
    """Build ``cls`` at 1-based ``layer`` with the given backend, randomize it, run it on random x."""
    module = randomize_(cls(cfg, layer, BACKENDS[backend_name]), seed)
    x = random_input(seed, cfg.d_model)
    rope = Rotary(T, cfg.attention.head_dim, cfg.rope_theta)
    with torch.no_grad():
        y = module(x, rope)
    assert y.dtype == torch.float64 and y.shape == x.shape
    return module, x, y


def tolerance(expected: torch.Tensor) -> float:
    return REL_TOL * expected.abs().max().item()


def assert_matches(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.shape == expected.shape and actual.dtype == expected.dtype == torch.float64
    err, tol = (actual - expected).abs().max().item(), tolerance(expected)
    assert err <= tol, f"max abs error {err:.3e} > tolerance {tol:.3e}"


# ---------------------------------------------------------------------------------------------
# Independent float64 math (no project code)


def rope(x: torch.Tensor, theta: float) -> torch.Tensor:
    """RoPE on ``x`` of shape (T, d): pair (x_2i, x_2i+1) at position t rotated by t * theta^(-2i/d)."""
    n, d = x.shape
    out = torch.empty_like(x)
    for i in range(d // 2):
        for t in range(n):
            angle = t * theta ** (-2.0 * i / d)
            c, s = math.cos(angle), math.sin(angle)
            a, b = x[t, 2 * i], x[t, 2 * i + 1]
            out[t, 2 * i] = a * c - b * s
            out[t, 2 * i + 1] = a * s + b * c
    return out


def rope_rotate_half(x: torch.Tensor, theta: float) -> torch.Tensor:
    """The WRONG convention for this project (pairs (i, i + d/2)); only used to show it is detected."""
    d = x.shape[1]
    halves_to_pairs = torch.stack([torch.arange(d // 2), torch.arange(d // 2) + d // 2], dim=1).flatten()
    out_pairs = rope(x[:, halves_to_pairs], theta)
    return out_pairs[:, torch.argsort(halves_to_pairs)]


def causal_probs(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """softmax(q kᵀ / √d) with position s > t masked out; q, k of shape (T, d)."""
    n, d = q.shape
    scores = (q @ k.T) / math.sqrt(d)
    allowed = torch.tensor([[s <= t for s in range(n)] for t in range(n)])
    scores = torch.where(allowed, scores, torch.full_like(scores, -math.inf))
    e = torch.exp(scores - scores.max(dim=-1, keepdim=True).values)
    return e / e.sum(dim=-1, keepdim=True)


def rmsnorm(x: torch.Tensor, gain: torch.Tensor, eps: float) -> torch.Tensor:
    return x / torch.sqrt((x * x).mean(dim=-1, keepdim=True) + eps) * gain


def rows(w: torch.Tensor, index: int, width: int) -> torch.Tensor:
    """Rows ``[index*width:(index+1)*width]`` of an ``(out, in)`` weight."""
    return w[index * width : (index + 1) * width]


def cols(w: torch.Tensor, index: int, width: int) -> torch.Tensor:
    return w[:, index * width : (index + 1) * width]


def expected_standard(m: StandardAttention, x: torch.Tensor, theta: float, eps: float) -> torch.Tensor:
    """Σ_i [norm](softmax(rope(x Wq_i) rope(x Wk_g)ᵀ/√d) x Wv_g) Wo_i, g = i // (h/h_kv)."""
    h, hkv, d = m.num_heads, m.num_kv_heads, m.head_dim
    wq, wk, wv, wo = m.wq.weight, m.wk.weight, m.wv.weight, m.wo.weight
    out = torch.zeros_like(x)
    for b in range(x.shape[0]):
        xb = x[b]
        for i in range(h):
            g = i // (h // hkv)
            q = rope(xb @ rows(wq, i, d).T, theta)
            k = rope(xb @ rows(wk, g, d).T, theta)
            v = xb @ rows(wv, g, d).T
            head = causal_probs(q, k) @ v
            if m.head_norm is not None:
                head = rmsnorm(head, m.head_norm.weight, eps)
            out[b] += head @ cols(wo, i, d).T
    return out


def expected_diff_v1(
    m: DiffAttentionV1,
    x: torch.Tensor,
    theta: float,
    eps: float,
    lambda_init: float,
    head_norm: bool,
    *,
    lam_shift: float | None = None,
    rope_fn=None,
) -> torch.Tensor:
    """Paper eq. 1-3 with GQA: head i = (A(Q1_i, K1_g) − λ A(Q2_i, K2_g)) V_g, g = i // (h/h_kv),
    λ = exp(λq1·λk1) − exp(λq2·λk2) + λ_init; then (1 − λ_init)·RMSNorm_2d(head) if head_norm."""
    h, hkv, d = m.num_heads, m.num_kv_heads, m.head_dim
    wq, wk, wv, wo = m.wq.weight, m.wk.weight, m.wv.weight, m.wo.weight
    rope_fn = rope_fn or rope  # (the tolerance test swaps in a wrong RoPE / λ to show they fail)
    lam = (
        math.exp(float(m.lambda_q1 @ m.lambda_k1))
        - math.exp(float(m.lambda_q2 @ m.lambda_k2))
        + (lambda_init if lam_shift is None else lam_shift)
    )
    out = torch.zeros_like(x)
    for b in range(x.shape[0]):
        xb = x[b]
        for i in range(h):
            g = i // (h // hkv)
            q1 = rope_fn(xb @ rows(wq, 2 * i, d).T, theta)
            q2 = rope_fn(xb @ rows(wq, 2 * i + 1, d).T, theta)
            k1 = rope_fn(xb @ rows(wk, 2 * g, d).T, theta)
            k2 = rope_fn(xb @ rows(wk, 2 * g + 1, d).T, theta)
            v = xb @ rows(wv, g, 2 * d).T  # (T, 2d)
            head = (causal_probs(q1, k1) - lam * causal_probs(q2, k2)) @ v
            if head_norm:
                head = (1.0 - lambda_init) * rmsnorm(head, m.head_norm.weight, eps)
            out[b] += head @ cols(wo, i, 2 * d).T
    return out


def v2_partner(i: int, h: int, pairing: str) -> tuple[int, int]:
    """The two query heads DIFF V2's output head i subtracts (documented layout)."""
    return (2 * i, 2 * i + 1) if pairing == "same_group" else (i, i + h)


def expected_diff_v2(m: DiffAttentionV2, x: torch.Tensor, theta: float, pairing: str, lam_mode: str):
    """V2 blog: head i = A(q_a) − λ_i A(q_b) on the query heads' own K/V groups (group of query
    head j = j // (2h/h_kv)); λ_i = sigmoid(x·W_λ[i]) per token (raw: no sigmoid; none: λ = 1)."""
    h, hkv, d = m.num_heads, m.num_kv_heads, m.head_dim
    wq, wk, wv, wo = m.wq.weight, m.wk.weight, m.wv.weight, m.wo.weight
    per_group = (2 * h) // hkv
    out = torch.zeros_like(x)
    for b in range(x.shape[0]):
        xb = x[b]

        def attn(j: int, xb: torch.Tensor = xb) -> torch.Tensor:
            g = j // per_group
            q = rope(xb @ rows(wq, j, d).T, theta)
            k = rope(xb @ rows(wk, g, d).T, theta)
            return causal_probs(q, k) @ (xb @ rows(wv, g, d).T)

        for i in range(h):
            a, c = v2_partner(i, h, pairing)
            if lam_mode == "none":
                lam = torch.ones(xb.shape[0], 1, dtype=x.dtype)
            else:
                z = (xb @ m.wlambda.weight[i]).unsqueeze(-1)  # (T, 1): one λ per token
                lam = 1.0 / (1.0 + torch.exp(-z)) if lam_mode == "sigmoid" else z
            head = attn(a) - lam * attn(c)
            out[b] += head @ cols(wo, i, d).T
    return out


# ---------------------------------------------------------------------------------------------
# 1. Baseline Transformer


@pytest.mark.parametrize("backend", BACKEND_NAMES)
@pytest.mark.parametrize("head_norm", ["none", "rmsnorm"])
@pytest.mark.parametrize(
    "geometry",
    [
        ("model.attention.head_dim=16",),  # 4 heads, MHA
        ("model.attention.head_dim=16", "model.attention.num_kv_heads=2"),  # GQA 4 on 2
        ("model.attention.head_dim=16", "model.attention.num_kv_heads=1"),  # MQA
        ("model.attention.num_heads=2", "model.attention.head_dim=32"),  # head override, MHA
        ("model.attention.num_heads=2", "model.attention.head_dim=32", "model.attention.num_kv_heads=1"),
    ],
    ids=["mha4x16", "gqa4on2", "mqa4on1", "override2x32", "override2x32-gqa"],
)
def test_transformer_matches_per_head_formula(backend, head_norm, geometry):
    """Standard attention = Σ_i [RMSNorm_d](softmax(rope(Q_i) rope(K_g)ᵀ/√d) V_g) Wo_i, causal,
    with query head i on K/V head g = i // (h/h_kv), for MHA/GQA, both head norms, overridden
    head count/dim, and both backends."""
    cfg = model_cfg("model.attention.kind=transformer", f"model.attention.head_norm={head_norm}", *geometry)
    m, x, y = run_module(StandardAttention, cfg, 1, backend, seed=1)
    assert (m.head_norm is None) == (head_norm == "none")
    assert_matches(y, expected_standard(m, x, cfg.rope_theta, cfg.norm_eps))


# ---------------------------------------------------------------------------------------------
# 2. DIFF V1


V1_GEOMETRIES = {
    "mha2": ("model.attention.head_dim=16",),  # default h = 64 / (2*16) = 2 heads, 2 KV groups
    "gqa4on2": ("model.attention.head_dim=16", "model.attention.num_heads=4", "model.attention.num_kv_heads=2"),
    "gqa4on1": ("model.attention.head_dim=16", "model.attention.num_heads=4", "model.attention.num_kv_heads=1"),
}


@pytest.mark.parametrize("backend", BACKEND_NAMES)
@pytest.mark.parametrize("head_norm", ["none", "rmsnorm"])
@pytest.mark.parametrize("geometry", list(V1_GEOMETRIES))
@pytest.mark.parametrize(
    "lambda_init_spec, layer, lambda_init_value",
    [
        ("exp_decay", 3, 0.8 - 0.6 * math.exp(-0.3 * 2)),
        ("constant:0.5", 2, 0.5),
    ],
    ids=["exp_decay-layer3", "constant0.5-layer2"],
)
def test_diff_v1_matches_paper_equations(backend, head_norm, geometry, lambda_init_spec, layer, lambda_init_value):
    """DIFF V1 = paper eq. 1-3: per head (softmax(Q1K1ᵀ/√d) − λ softmax(Q2K2ᵀ/√d)) V with a 2d-wide
    V, one λ = exp(λq1·λk1) − exp(λq2·λk2) + λ_init shared by all heads of the layer, then
    (1 − λ_init)·RMSNorm over the head's 2d channels (head_norm=rmsnorm) or neither
    (head_norm=none). Under GQA each KV group owns its own K1, K2 and V, and head i uses group
    i // (h/h_kv). Checked for exp_decay at layer 3 and constant:0.5, on both backends."""
    cfg = model_cfg(
        "model.attention.kind=diff_v1",
        f"model.attention.head_norm={head_norm}",
        f"model.attention.lambda_init={lambda_init_spec}",
        *V1_GEOMETRIES[geometry],
    )
    m, x, y = run_module(DiffAttentionV1, cfg, layer, backend, seed=2)
    assert m.lambda_init == pytest.approx(lambda_init_value, abs=1e-15)
    assert (m.head_norm is None) == (head_norm == "none")
    expected = expected_diff_v1(m, x, cfg.rope_theta, cfg.norm_eps, lambda_init_value, head_norm == "rmsnorm")
    assert_matches(y, expected)


# ---------------------------------------------------------------------------------------------
# 3. DIFF V2


V2_GEOMETRIES = {
    "mha4": ("model.attention.head_dim=16",),  # h = 64/16 = 4 output heads, 8 query heads on 4 KV
    "gqa4on2": ("model.attention.head_dim=16", "model.attention.num_kv_heads=2"),
    "gqa4on1": ("model.attention.head_dim=16", "model.attention.num_kv_heads=1"),
}


@pytest.mark.parametrize("backend", BACKEND_NAMES)
@pytest.mark.parametrize("geometry", list(V2_GEOMETRIES))
@pytest.mark.parametrize("v2_lambda", ["sigmoid", "none", "raw"])
@pytest.mark.parametrize("pairing", ["same_group", "cross_group"])
def test_diff_v2_matches_blog_formula(backend, geometry, v2_lambda, pairing):
    """DIFF V2 = V2 blog: 2h query heads on h_kv K/V heads (query head j on group j // (2h/h_kv)),
    output head i = attn(q_2i) − λ_i·attn(q_2i+1) (cross_group: attn(q_i) − λ_i·attn(q_i+h)),
    λ_i = sigmoid(x W_λ[i]) per token and head (raw: no sigmoid; none: λ = 1), then W_O over the
    h·d channels; no per-head norm, no λ_init. Both backends."""
    cfg = model_cfg(
        "model.attention.kind=diff_v2",
        f"model.attention.v2_lambda={v2_lambda}",
        f"model.attention.v2_pairing={pairing}",
        *V2_GEOMETRIES[geometry],
    )
    m, x, y = run_module(DiffAttentionV2, cfg, 1, backend, seed=3)
    assert_matches(y, expected_diff_v2(m, x, cfg.rope_theta, pairing, v2_lambda))


def _kv_groups_each_output_head_reads(m: DiffAttentionV2, x: torch.Tensor, theta: float) -> list[set[int]]:
    """For each output head i, the K/V groups whose weights change head i's output (found by
    perturbing one group's wk/wv rows at a time, with wo = identity so output channels
    [i*d:(i+1)*d] are head i)."""
    h, hkv, d = m.num_heads, m.num_kv_heads, m.head_dim
    rope_tables = Rotary(T, d, theta)
    with torch.no_grad():
        m.wo.weight.copy_(torch.eye(m.wo.weight.shape[0], dtype=torch.float64))
        base = m(x, rope_tables)
        reads = [set() for _ in range(h)]
        for g in range(hkv):
            saved_k, saved_v = m.wk.weight.clone(), m.wv.weight.clone()
            m.wk.weight[g * d : (g + 1) * d] += 1.0
            m.wv.weight[g * d : (g + 1) * d] += 1.0
            changed = (m(x, rope_tables) - base).abs()
            m.wk.weight.copy_(saved_k)
            m.wv.weight.copy_(saved_v)
            for i in range(h):
                if changed[..., i * d : (i + 1) * d].max() > 1e-6:
                    reads[i].add(g)
    return reads


@pytest.mark.parametrize("backend", BACKEND_NAMES)
@pytest.mark.parametrize("num_kv_heads", [2, 4])
@pytest.mark.parametrize("pairing", ["same_group", "cross_group"])
def test_diff_v2_pairing_respects_gqa_groups(backend, num_kv_heads, pairing):
    """With GQA (h_kv >= 2), same_group subtracts two query heads of the SAME K/V group (each
    output head depends on exactly one group's K/V), while cross_group subtracts heads of
    DIFFERENT groups (each output head depends on exactly two groups), as the blog's ablation 1
    requires. Checked behaviourally (perturbing one group's K/V weights) and by index arithmetic."""
    cfg = model_cfg(
        "model.attention.kind=diff_v2",
        "model.attention.head_dim=16",
        f"model.attention.num_kv_heads={num_kv_heads}",
        f"model.attention.v2_pairing={pairing}",
    )
    h, d = cfg.attention.num_heads, cfg.attention.head_dim
    assert h * d == D  # wo is square, so it can be set to the identity
    m = randomize_(DiffAttentionV2(cfg, 1, BACKENDS[backend]), seed=4)
    reads = _kv_groups_each_output_head_reads(m, random_input(4), cfg.rope_theta)
    per_group = 2 * h // num_kv_heads
    for i in range(h):
        a, c = v2_partner(i, h, pairing)
        groups = {a // per_group, c // per_group}
        assert reads[i] == groups
        assert len(groups) == (1 if pairing == "same_group" else 2)


@pytest.mark.parametrize("v2_lambda, has_wlambda", [("sigmoid", True), ("raw", True), ("none", False)])
def test_diff_v2_lambda_switch_parameter_layout(v2_lambda, has_wlambda):
    """v2_lambda=none (blog ablation 2, attn1 − attn2) has no λ projection parameter at all;
    sigmoid and raw have ``wlambda.weight`` of shape (h, d_model), one row per output head."""
    cfg = model_cfg("model.attention.kind=diff_v2", "model.attention.head_dim=16", f"model.attention.v2_lambda={v2_lambda}")
    m = DiffAttentionV2(cfg, 1, BACKENDS[Backend.REFERENCE])
    params = dict(m.named_parameters())
    assert ("wlambda.weight" in params) is has_wlambda
    assert not any("lambda" in name for name in params) or has_wlambda
    if has_wlambda:
        assert params["wlambda.weight"].shape == (cfg.attention.num_heads, D)
    else:
        assert m.wlambda is None
        assert m.lambda_values(random_input(0).float()) is None


# ---------------------------------------------------------------------------------------------
# 4. λ_init schedules


def lambda_init_schedule_of(spec: str, n_layers: int) -> list[float]:
    """λ_init of layers 1..n_layers for a config spelling (``exp_decay``, ``constant:0.8``)."""
    return LambdaInit.parse(spec).schedule(n_layers)


@pytest.mark.parametrize("n_layers", [1, 4, 12])
def test_lambda_init_exp_decay_schedule(n_layers):
    """exp_decay gives λ_init(l) = 0.8 − 0.6·exp(−0.3·(l − 1)) for l = 1..L (paper §2.1): 0.2 at
    the first layer, increasing towards 0.8."""
    got = lambda_init_schedule_of("exp_decay", n_layers)
    want = [0.8 - 0.6 * math.exp(-0.3 * (layer - 1)) for layer in range(1, n_layers + 1)]
    assert len(got) == n_layers
    assert got == pytest.approx(want, abs=1e-15)
    assert got[0] == pytest.approx(0.2, abs=1e-15)
    assert all(a < b for a, b in zip(got, got[1:]))


@pytest.mark.parametrize("value", [0.8, 0.5, 0.3])
def test_lambda_init_constant_schedule(value):
    """constant:<v> (Table 6 ablation) gives the same λ_init = v in every layer."""
    assert lambda_init_schedule_of(f"constant:{value}", 6) == pytest.approx([value] * 6, abs=1e-15)


@pytest.mark.parametrize("spec", ["exp_decay", "constant:0.8", "constant:0.5"])
def test_diff_v1_layer_lambda_init_follows_schedule(spec):
    """A DiffAttentionV1 built at 1-based layer l, alone or inside build_model's layer l, has
    ``.lambda_init`` equal to the schedule's l-th value."""
    n_layers = 5
    schedule = lambda_init_schedule_of(spec, n_layers)
    cfg = model_cfg(
        "model.attention.kind=diff_v1", "model.attention.head_dim=16", f"model.attention.lambda_init={spec}",
        "model.vocab_size=97", f"model.n_layers={n_layers}",
    )
    for layer in range(1, n_layers + 1):
        m = DiffAttentionV1(cfg, layer, BACKENDS[Backend.REFERENCE])
        assert m.lambda_init == pytest.approx(schedule[layer - 1], abs=1e-15)
    model = build_model(cfg)
    assert [blk.attention.lambda_init for blk in model.layers] == pytest.approx(schedule, abs=1e-15)


# ---------------------------------------------------------------------------------------------
# 5. DIFF V1 with λ = 0 is plain attention on the first map


@pytest.mark.parametrize("backend", BACKEND_NAMES)
@pytest.mark.parametrize("geometry", list(V1_GEOMETRIES))
def test_diff_v1_with_zero_lambda_is_softmax_attention_on_first_map(backend, geometry):
    """With λq2 = λq1, λk2 = λk1 (the exp terms cancel), λ_init = 0 and head_norm=none, DIFF V1
    is Σ_i softmax(Q1_i K1_gᵀ/√d) V_g Wo_i: the second map (Q2, K2) has no influence."""
    cfg = model_cfg("model.attention.kind=diff_v1", "model.attention.head_norm=none", *V1_GEOMETRIES[geometry])
    m = randomize_(DiffAttentionV1(cfg, 2, BACKENDS[backend]), seed=5)
    with torch.no_grad():
        m.lambda_q2.copy_(m.lambda_q1)
        m.lambda_k2.copy_(m.lambda_k1)
    m.lambda_init = 0.0
    assert float(m.lambda_full()) == 0.0
    x = random_input(5)
    with torch.no_grad():
        y = m(x, Rotary(T, cfg.attention.head_dim, cfg.rope_theta))

    h, hkv, d = m.num_heads, m.num_kv_heads, m.head_dim
    expected = torch.zeros_like(x)
    for b in range(B):
        for i in range(h):
            g = i // (h // hkv)
            q1 = rope(x[b] @ rows(m.wq.weight, 2 * i, d).T, cfg.rope_theta)
            k1 = rope(x[b] @ rows(m.wk.weight, 2 * g, d).T, cfg.rope_theta)
            v = x[b] @ rows(m.wv.weight, g, 2 * d).T
            expected[b] += causal_probs(q1, k1) @ v @ cols(m.wo.weight, i, 2 * d).T
    assert_matches(y, expected)


# ---------------------------------------------------------------------------------------------
# 6. Causality of whole models


MODEL_KINDS = {
    "transformer": ("model.attention.kind=transformer", "model.attention.num_kv_heads=2"),
    "transformer-headnorm": ("model.attention.kind=transformer", "model.attention.head_norm=rmsnorm"),
    "diff_v1": ("model.attention.kind=diff_v1",),
    "diff_v1-gqa": ("model.attention.kind=diff_v1", "model.attention.num_heads=4", "model.attention.num_kv_heads=2"),
    "diff_v2": ("model.attention.kind=diff_v2", "model.attention.num_kv_heads=2"),
    "diff_v2-cross": ("model.attention.kind=diff_v2", "model.attention.num_kv_heads=2",
                      "model.attention.v2_pairing=cross_group"),
}


@pytest.mark.parametrize("backend", BACKEND_NAMES)
@pytest.mark.parametrize("kind", list(MODEL_KINDS))
def test_model_is_causal(backend, kind):
    """For a whole 2-layer model of each kind: changing tokens at positions > t leaves the logits
    at positions <= t unchanged, and changing the token at position t changes the logits at t."""
    cfg = model_cfg(
        "model.vocab_size=97", "model.n_layers=2", "model.attention.head_dim=16",
        f"model.attention.backend={backend.value}", *MODEL_KINDS[kind],
    )
    model = randomize_(build_model(cfg), seed=6).eval()
    gen = torch.Generator().manual_seed(6)
    tokens = torch.randint(0, cfg.vocab_size, (B, T), generator=gen)
    with torch.no_grad():
        base = model(tokens)
        for t in (0, 4, T - 2):
            future = tokens.clone()
            future[:, t + 1 :] = (tokens[:, t + 1 :] + 1 + torch.randint(0, 90, (B, T - t - 1), generator=gen)) % cfg.vocab_size
            assert (future[:, t + 1 :] != tokens[:, t + 1 :]).all()
            changed_future = model(future)
            torch.testing.assert_close(changed_future[:, : t + 1], base[:, : t + 1], atol=1e-12, rtol=0)
            assert (changed_future[:, t + 1 :] - base[:, t + 1 :]).abs().amax() > 1e-6

            present = tokens.clone()
            present[:, t] = (tokens[:, t] + 1) % cfg.vocab_size
            changed_present = model(present)
            torch.testing.assert_close(changed_present[:, :t], base[:, :t], atol=1e-12, rtol=0)
            assert (changed_present[:, t] - base[:, t]).abs().amax(dim=-1).min() > 1e-6


# ---------------------------------------------------------------------------------------------
# The tolerance is meaningful


def test_tolerance_detects_layout_errors():
    """Guards the float64-level tolerance: for DIFF V1 under GQA (rmsnorm, exp_decay at layer 3), the
    correct formula matches within the tolerance while each plausible mistake — Q1/Q2 swapped,
    the wrong GQA group, rotate-half instead of interleaved RoPE, no (1 − λ_init) factor, λ
    without λ_init — misses by more than 1000 × the tolerance."""
    cfg = model_cfg("model.attention.kind=diff_v1", *V1_GEOMETRIES["gqa4on2"])
    m, x, y = run_module(DiffAttentionV1, cfg, 3, Backend.REFERENCE, seed=7)
    lam_init = m.lambda_init
    theta, eps = cfg.rope_theta, cfg.norm_eps
    correct = expected_diff_v1(m, x, theta, eps, lam_init, True)
    assert_matches(y, correct)
    tol = tolerance(correct)

    def miss(expected):
        return (y - expected).abs().max().item()

    mistakes = {
        "no (1-λ_init) factor": miss(correct / (1.0 - lam_init)),
        "λ without + λ_init": miss(expected_diff_v1(m, x, theta, eps, lam_init, True, lam_shift=0.0)),
        "rotate-half RoPE": miss(expected_diff_v1(m, x, theta, eps, lam_init, True, rope_fn=rope_rotate_half)),
    }
    d = m.head_dim
    saved_q, saved_k, saved_v = m.wq.weight.clone(), m.wk.weight.clone(), m.wv.weight.clone()
    with torch.no_grad():
        # Q1 and Q2 swapped: exchange each head's two row blocks of wq.
        m.wq.weight.copy_(saved_q.view(m.num_heads, 2, d, D).flip(1).reshape(-1, D))
        mistakes["Q1/Q2 swapped"] = miss(expected_diff_v1(m, x, theta, eps, lam_init, True))
        m.wq.weight.copy_(saved_q)
        # Heads read the other GQA group (the two groups' K1/K2 and V row blocks exchanged).
        m.wk.weight.copy_(saved_k.view(2, 2 * d, D).flip(0).reshape(-1, D))
        m.wv.weight.copy_(saved_v.view(2, 2 * d, D).flip(0).reshape(-1, D))
        mistakes["wrong GQA group"] = miss(expected_diff_v1(m, x, theta, eps, lam_init, True))
        m.wk.weight.copy_(saved_k)
        m.wv.weight.copy_(saved_v)
    for name, error in mistakes.items():
        assert error > 1000 * tol, f"{name}: miss {error:.2e} is not far above the tolerance"
