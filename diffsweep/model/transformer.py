"""The LLaMA-style decoder shared by all attention kinds, and ``build_model``."""

from __future__ import annotations

import dataclasses
import math

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from diffsweep.config import AttentionKind, Backend, ModelConfig
from diffsweep.config.kinds import KIND_SPECS
from diffsweep.model import counting
from diffsweep.model.attention.backends import AttentionBackend, AttentionCall, resolve_backend
from diffsweep.model.attention.diff_v1 import DiffAttentionV1
from diffsweep.model.attention.diff_v2 import DiffAttentionV2
from diffsweep.model.attention.standard import StandardAttention
from diffsweep.model.layers import RMSNorm, Rotary, SwiGLU

# The one registry from attention kind to its module.
ATTENTION_MODULES: dict[AttentionKind, type[nn.Module]] = {
    AttentionKind.TRANSFORMER: StandardAttention,
    AttentionKind.DIFF_V1: DiffAttentionV1,
    AttentionKind.DIFF_V2: DiffAttentionV2,
}


class Block(nn.Module):
    """Pre-norm residual block: ``x + attn(norm(x))`` then ``x + ffn(norm(x))``."""

    def __init__(self, cfg: ModelConfig, layer: int, backend: AttentionBackend) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attention = ATTENTION_MODULES[cfg.attention.kind](cfg, layer, backend)
        self.ffn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.feed_forward = SwiGLU(cfg.d_model, cfg.ffn_hidden)

    def forward(self, x: torch.Tensor, rope: Rotary) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), rope)
        return x + self.feed_forward(self.ffn_norm(x))


class LanguageModel(nn.Module):
    """Decoder-only LM: token embedding, ``n_layers`` blocks, final RMSNorm, output head.

    Parameter names are listed (with shapes) by ``diffsweep.model.counting.parameter_shapes``.
    With ``tie_embeddings`` the output head reuses ``tok_embeddings.weight``.
    """

    def __init__(self, cfg: ModelConfig, backend: AttentionBackend) -> None:
        super().__init__()
        self.cfg = cfg
        self.activation_checkpointing = False  # training keeps only block inputs; blocks rerun in the backward
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.d_model)
        # Layers are numbered 1..L, as in the paper's λ_init formula.
        self.layers = nn.ModuleList(Block(cfg, layer, backend) for layer in range(1, cfg.n_layers + 1))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.output = None if cfg.tie_embeddings else nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Init: every matrix N(0, init_std); norm gains 1; DIFF V1's λ vectors N(0, 0.1)."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=self.cfg.init_std)
            elif isinstance(module, RMSNorm):
                module.reset_parameters()
            elif isinstance(module, DiffAttentionV1):
                module.reset_lambda()

    def output_weight(self) -> torch.Tensor:
        return self.tok_embeddings.weight if self.output is None else self.output.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits ``(B, T, vocab)`` for token ids ``(B, T)``."""
        x = self.tok_embeddings(tokens)
        head_dim = self.cfg.attention.head_dim
        rope = Rotary(tokens.shape[1], head_dim, self.cfg.rope_theta, device=tokens.device)
        for block in self.layers:
            if self.activation_checkpointing and self.training:
                x = checkpoint(block, x, rope, use_reentrant=False)  # recompute the block in the backward
            else:
                x = block(x, rope)
        return torch.nn.functional.linear(self.norm(x), self.output_weight())


def attention_call(cfg: ModelConfig) -> AttentionCall:
    """The attention shape the model of ``cfg`` will ask its backend for (from its kind's spec)."""
    a, spec = cfg.attention, KIND_SPECS[cfg.attention.kind]
    differential = a.kind is AttentionKind.DIFF_V1  # the only kind that calls diff_attend
    num_q = a.num_heads * (1 if differential else spec.query_heads_per_head)
    return AttentionCall(num_q, a.num_kv_heads, a.head_dim, spec.v_width * a.head_dim, differential=differential)


def build_model(
    cfg: ModelConfig, *, device: torch.device | str = "cpu", compute_dtype: torch.dtype = torch.float32
) -> LanguageModel:
    """Build and initialise the model of a resolved config on ``device`` (``"meta"`` for shapes only).

    The attention backend is checked here, once: an unavailable or unsupported backend raises
    ``EnvironmentUnavailable`` naming ``model.attention.backend`` and the reason.
    ``compute_dtype`` is the dtype attention inputs will have (bf16 under bf16 autocast).
    """
    backend = resolve_backend(cfg.attention.backend, attention_call(cfg), device=device, dtype=compute_dtype)
    with torch.device(device):
        return LanguageModel(cfg, backend)


def build_meta_model(cfg: ModelConfig) -> LanguageModel:
    """Build on the meta device (no memory, any size) with the always-available reference backend."""
    cfg = dataclasses.replace(cfg, attention=dataclasses.replace(cfg.attention, backend=Backend.REFERENCE))
    return build_model(cfg, device="meta")


def meta_parameter_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Names and shapes of a meta-device model's parameters (tied weights listed once)."""
    return {name: tuple(p.shape) for name, p in build_meta_model(cfg).named_parameters()}


def count_on_meta(cfg: ModelConfig) -> int:
    """Parameters of the real module tree of ``cfg`` (built on meta), after checking that every
    name and shape equals ``counting.parameter_shapes`` (the pure-Python count)."""
    meta = meta_parameter_shapes(cfg)
    expected = {name: p.shape for name, p in counting.parameter_shapes(cfg).items()}
    assert meta == expected, f"counting disagrees with the module tree: {sorted(set(meta.items()) ^ set(expected.items()))[:3]}"
    return sum(math.prod(shape) for shape in meta.values())
