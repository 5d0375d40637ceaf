"""Parameter and FLOP counting without building a model (pure Python, no torch).

``parameter_shapes`` lists every parameter the model of a config has, by the same name and shape
as ``LanguageModel.named_parameters()`` (a test checks this against a meta-device model for every
preset), so counts, FLOPs and weight layouts come from one table.

Conventions (stated because scaling-law results depend on them):
- non-embedding parameters = all parameters except the token-embedding matrix and, when untied,
  the output matrix (Kaplan et al. 2020);
- FLOPs count matrix multiplies only, 2 per multiply-accumulate; the LM head always counts
  (tied or not); attention counts the full T x T score matrix (no halving for the causal mask,
  PaLM App. B), as the kernels execute it (each kind's ``KindSpec.attention_flops``: DIFF V1
  runs two maps, each against its 2d-wide V; DIFF V2 runs one call over 2h query heads);
- training FLOPs per token = 3 x forward (backward = 2 x forward).
"""

from __future__ import annotations

import functools

from diffsweep.config import ResolvedAttention, ResolvedModel
from diffsweep.config.kinds import ParamInfo, kind_spec

Shape = tuple[int, ...]

__all__ = ["ParamInfo", "Shape", "attention_params", "forward_flops_per_token",
           "num_attention_params", "num_embedding_params", "num_non_embedding_params", "num_params",
           "parameter_shapes", "train_flops_per_token"]


def attention_params(a: ResolvedAttention, d_model: int) -> dict[str, ParamInfo]:
    """Parameters of one attention module of resolved ``a`` (names inside the module), from its kind."""
    return kind_spec(a.kind).attention_params(a, d_model)


def parameter_shapes(m: ResolvedModel) -> dict[str, ParamInfo]:
    """Every parameter of the model, named as in ``LanguageModel.named_parameters()``."""
    D, F, V = m.d_model, m.ffn_hidden, m.vocab_size
    params: dict[str, ParamInfo] = {"tok_embeddings.weight": ParamInfo((V, D))}
    attention = attention_params(m.attention, D)
    for i in range(m.n_layers):
        p = f"layers.{i}."
        params[p + "attention_norm.weight"] = ParamInfo((D,))
        params.update({p + "attention." + k: v for k, v in attention.items()})
        params[p + "ffn_norm.weight"] = ParamInfo((D,))
        params[p + "feed_forward.w_gate.weight"] = ParamInfo((F, D), True)
        params[p + "feed_forward.w_up.weight"] = ParamInfo((F, D), True)
        params[p + "feed_forward.w_down.weight"] = ParamInfo((D, F), True)
    params["norm.weight"] = ParamInfo((D,))
    if not m.tie_embeddings:
        params["output.weight"] = ParamInfo((V, D))
    return params


@functools.lru_cache(maxsize=4096)  # configs are frozen; a sweep asks for the same model many times
def num_params(m: ResolvedModel) -> int:
    """Total parameters (tied embeddings counted once)."""
    return sum(p.numel for p in parameter_shapes(m).values())


def num_embedding_params(m: ResolvedModel) -> int:
    """Token-embedding parameters, plus the output matrix when untied."""
    return m.vocab_size * m.d_model * (1 if m.tie_embeddings else 2)


def num_non_embedding_params(m: ResolvedModel) -> int:
    """Total minus embedding parameters (the N of Kaplan-style scaling laws)."""
    return num_params(m) - num_embedding_params(m)


def num_attention_params(m: ResolvedModel) -> int:
    """Parameters of all attention modules (projections, λ, per-head norm)."""
    return m.n_layers * sum(p.numel for p in attention_params(m.attention, m.d_model).values())


@functools.lru_cache(maxsize=4096)
def forward_flops_per_token(m: ResolvedModel, seq_len: int) -> int:
    """Forward matmul FLOPs per token at sequence length ``seq_len`` (conventions above)."""
    matmul = sum(p.numel for name, p in parameter_shapes(m).items() if p.matmul)
    head = m.vocab_size * m.d_model
    attention = m.n_layers * kind_spec(m.attention.kind).attention_flops(m.attention, seq_len)
    return 2 * (matmul + head) + attention


def train_flops_per_token(m: ResolvedModel, seq_len: int) -> int:
    """Training (forward + backward) FLOPs per token: 3 x forward."""
    return 3 * forward_flops_per_token(m, seq_len)
