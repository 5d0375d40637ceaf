"""Every registered kind's module against its spec, the generic initialisation, and the RoPE tables
built once per model."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from diffsweep.config import load_config
from diffsweep.config.kinds import kind_names, kind_spec
from diffsweep.model.attention.backends import BACKENDS
from diffsweep.model.attention.base import AttentionModule
from diffsweep.model.layers import Rotary
from diffsweep.model.transformer import attention_call, attention_module, build_model

KINDS = kind_names()


def tiny(kind: str, *sets: str):
    return load_config(None, ["model.size=tiny-2xs", f"model.attention.kind={kind}", *sets]).model


@pytest.mark.parametrize("kind", KINDS)
def test_module_is_project_then_core_then_wo_and_initialises_itself(kind):
    cfg = tiny(kind)
    spec = kind_spec(cfg.attention.kind)
    cls = attention_module(cfg.attention.kind)
    assert issubclass(cls, AttentionModule) and cls.__name__ == spec.module.rsplit(":", 1)[1]
    torch.manual_seed(0)
    model = build_model(cfg)
    attention = model.layers[0].attention
    for name, p in attention.named_parameters(recurse=False):  # the module's own: set by reset_parameters
        assert torch.isfinite(p).all() and p.abs().max() < 1.0, name
    x = torch.randn(2, 8, cfg.d_model)
    rope = Rotary(8, cfg.attention.head_dim, cfg.rope_theta)
    assert torch.equal(attention(x, rope), attention.wo(attention.core(*attention.project(x, rope))))
    # The backend call the spec declares is the one the module makes.
    call = attention_call(cfg)
    seen = []

    class Spy(type(attention.backend)):
        def attend(self, q, k, v, *, scale):
            seen.append(("attend", q.shape[1], k.shape[1], q.shape[-1], v.shape[-1]))
            return super().attend(q, k, v, scale=scale)

        def diff_attend(self, q1, k1, q2, k2, v, lam, *, scale):
            seen.append(("diff_attend", q1.shape[1], k1.shape[1], q1.shape[-1], v.shape[-1]))
            return BACKENDS[self.name].diff_attend(q1, k1, q2, k2, v, lam, scale=scale)

    attention.backend = Spy()
    attention(x, rope)
    op = "diff_attend" if call.differential else "attend"
    assert seen == [(op, call.num_q_heads, call.num_kv_heads, call.qk_dim, call.v_dim)]


def test_a_module_with_parameters_of_its_own_must_initialise_them():
    class Forgetful(AttentionModule):
        def __init__(self):
            super().__init__()
            self.scale = nn.Parameter(torch.empty(1))

    with pytest.raises(NotImplementedError, match=r"Forgetful has its own parameters \['scale'\]"):
        Forgetful().reset_parameters()


@pytest.mark.parametrize("kind", KINDS)
def test_init_is_unchanged_by_the_generic_reset(kind):
    """The model draws in module order: the same parameters, bit for bit, as a model that inits
    Linear/Embedding weights and then each module's own in the same walk (the golden loss curves
    depend on it)."""
    cfg = tiny(kind)
    torch.manual_seed(3)
    model = build_model(cfg)
    torch.manual_seed(3)
    again = build_model(cfg)
    for (name, a), (_, b) in zip(model.named_parameters(), again.named_parameters(), strict=True):
        assert torch.equal(a, b), name


def test_rope_tables_are_built_once_and_equal_fresh_ones():
    cfg = tiny("diff_v1")
    model = build_model(cfg)
    tokens = torch.randint(0, cfg.vocab_size, (2, 16))
    first = model(tokens)
    rope = model.rope(16, tokens.device)
    assert model.rope(16, tokens.device) is rope and model.rope(5, tokens.device) is rope  # cached; shorter reuses
    assert torch.equal(model(tokens), first)
    fresh = Rotary(5, cfg.attention.head_dim, cfg.rope_theta)
    assert torch.equal(rope.cos64[:5], fresh.cos64) and torch.equal(rope.sin[:5], fresh.sin)  # prefixes are exact
    # A shorter sequence read from the longer table gives the logits a table of its own length gives.
    from_longer = model(tokens[:, :5])
    model._rope.clear()
    assert torch.equal(model(tokens[:, :5]), from_longer) and model.rope(5, tokens.device).seq_len == 5
    longer = model.rope(32, tokens.device)
    assert longer.seq_len == 32 and model.rope(16, tokens.device) is longer
    assert "_rope" not in "".join(model.state_dict())  # not saved: checkpoints are unchanged
