"""The LLaMA-style decoder shared by all attention kinds, and ``build_model``."""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Iterator
from typing import Protocol, runtime_checkable

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from diffsweep.config import AttentionKind, Backend, ResolvedModel
from diffsweep.config.kinds import kind_spec
from diffsweep.model import counting
from diffsweep.model.attention.backends import AttentionBackend, AttentionCall, resolve_backend
from diffsweep.model.attention.base import AttentionModule
from diffsweep.model.layers import RMSNorm, Rotary, SwiGLU


def attention_module(kind: AttentionKind) -> type[AttentionModule]:
    """The module class of ``kind`` (its ``KindSpec.module``, imported on first use)."""
    cls = kind_spec(kind).load_module()
    if not (isinstance(cls, type) and issubclass(cls, AttentionModule)):
        raise TypeError(f"attention kind {kind!r}: {kind_spec(kind).module} is not a "
                        "diffsweep.model.attention.base.AttentionModule")
    return cls


@runtime_checkable
class _Resettable(Protocol):
    """A module that initialises its own parameters (norms, attention modules, plug-ins' modules)."""

    def reset_parameters(self) -> None: ...


class Block(nn.Module):
    """Pre-norm residual block: ``x + attn(norm(x))`` then ``x + ffn(norm(x))``."""

    attention: AttentionModule

    def __init__(self, cfg: ResolvedModel, layer: int, backend: AttentionBackend) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attention = attention_module(cfg.attention.kind)(cfg, layer, backend)
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

    def __init__(self, cfg: ResolvedModel, backend: AttentionBackend) -> None:
        super().__init__()
        self.cfg = cfg
        self.activation_checkpointing = False  # training keeps only block inputs; blocks rerun in the backward
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.d_model)
        # Layers are numbered 1..L, as in the paper's λ_init formula.
        self.layers = nn.ModuleList(Block(cfg, layer, backend) for layer in range(1, cfg.n_layers + 1))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.output = None if cfg.tie_embeddings else nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        # RoPE tables, built once per length and device (not per forward): a table for T tokens
        # starts with the table of any shorter length, bit for bit, so the longest one serves all.
        self._rope: dict[torch.device, Rotary] = {}
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Init: every matrix N(0, init_std); every other module initialises itself (norm gains 1,
        DIFF V1's λ vectors N(0, 0.1), a plug-in kind's own parameters), in module order."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=self.cfg.init_std)
            elif module is not self and isinstance(module, _Resettable):  # has reset_parameters
                module.reset_parameters()

    def rope(self, seq_len: int, device: torch.device) -> Rotary:
        """The RoPE tables for ``seq_len`` tokens on ``device`` (cached; rebuilt only to grow)."""
        rope = self._rope.get(device)
        if rope is None or rope.seq_len < seq_len:
            rope = self._rope[device] = Rotary(seq_len, self.cfg.attention.head_dim, self.cfg.rope_theta, device=device)
        return rope

    @contextlib.contextmanager
    def rope_theta(self, theta: float) -> Iterator[None]:
        """Run with RoPE base ``theta`` inside the block (e.g. an evaluation at a raised θ, paper
        §3.3); the model's own θ and its cached tables are back afterwards, even on an error."""
        cfg, tables = self.cfg, self._rope
        self.cfg, self._rope = dataclasses.replace(cfg, rope_theta=theta), {}  # tables rebuilt on first use
        try:
            yield
        finally:
            self.cfg, self._rope = cfg, tables

    def blocks(self) -> list[Block]:
        """``layers``, typed as the blocks they are (``nn.ModuleList`` is typed as holding any module)."""
        return [block for block in self.layers if isinstance(block, Block)]

    def output_weight(self) -> torch.Tensor:
        return self.tok_embeddings.weight if self.output is None else self.output.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits ``(B, T, vocab)`` for token ids ``(B, T)``."""
        x = self.tok_embeddings(tokens)
        rope = self.rope(tokens.shape[1], tokens.device)
        for block in self.layers:
            if self.activation_checkpointing and self.training:
                x = checkpoint(block, x, rope, use_reentrant=False)  # recompute the block in the backward
            else:
                x = block(x, rope)
        return torch.nn.functional.linear(self.norm(x), self.output_weight())


def attention_call(cfg: ResolvedModel) -> AttentionCall:
    """The attention shape the model of ``cfg`` will ask its backend for (from its kind's spec)."""
    spec = kind_spec(cfg.attention.kind)
    return AttentionCall(*spec.call_shape(cfg.attention), differential=spec.differential)


def build_model(
    cfg: ResolvedModel, *, device: torch.device | str = "cpu", compute_dtype: torch.dtype = torch.float32
) -> LanguageModel:
    """Build and initialise the model of a resolved config on ``device`` (``"meta"`` for shapes only).

    The attention backend is checked here, once: an unavailable or unsupported backend raises
    ``EnvironmentUnavailable`` naming ``model.attention.backend`` and the reason.
    ``compute_dtype`` is the dtype attention inputs will have (bf16 under bf16 autocast).
    """
    backend = resolve_backend(cfg.attention.backend, attention_call(cfg), device=device, dtype=compute_dtype)
    with torch.device(device):
        return LanguageModel(cfg, backend)


def build_meta_model(cfg: ResolvedModel) -> LanguageModel:
    """Build on the meta device (no memory, any size) with the always-available reference backend."""
    cfg = dataclasses.replace(cfg, attention=dataclasses.replace(cfg.attention, backend=Backend.REFERENCE))
    return build_model(cfg, device="meta")


def meta_parameter_shapes(cfg: ResolvedModel) -> dict[str, tuple[int, ...]]:
    """Names and shapes of a meta-device model's parameters (tied weights listed once)."""
    return {name: tuple(p.shape) for name, p in build_meta_model(cfg).named_parameters()}


def count_on_meta(cfg: ResolvedModel) -> int:
    """Parameters of the real module tree of ``cfg`` (built on meta), after checking that every
    name and shape equals ``counting.parameter_shapes`` (the pure-Python count)."""
    meta = meta_parameter_shapes(cfg)
    expected = {name: p.shape for name, p in counting.parameter_shapes(cfg).items()}
    assert meta == expected, f"counting disagrees with the module tree: {sorted(set(meta.items()) ^ set(expected.items()))[:3]}"
    return sum(math.prod(shape) for shape in meta.values())
