"""``torch.compile`` of each attention kind's model on the CPU (inductor's C++ code), as
``bench model --compile`` compiles them on a GPU: bf16 autocast, the default ``sdpa`` backend, in
one graph (``fullgraph=True``: a graph break is an error, not a silent fallback to eager)."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from diffsweep.config import load_config
from diffsweep.model.transformer import build_model

KINDS = ("transformer", "diff_v1", "diff_v2")

# Compiled vs eager, both under bf16 autocast. Inductor fuses pointwise ops and keeps their
# intermediates in fp32 where eager rounds each op's output to bf16 (unit roundoff 2^-9), so the
# two differ by bf16 rounding, not by fp32's. The loss (~5.5, a mean over 64 tokens) moved by at
# most 6e-5 when measured (2026-11-27); 1e-3 leaves 16x. Gradients: all of them together within 5%
# relative (measured at most 0.7%, about eager bf16's own distance from fp32), and each
# parameter's gradient pointing the same way (cosine >= 0.9; measured >= 0.97, the lowest for
# DIFF V1's λ vectors, whose gradient is a small difference of large terms).
LOSS_ABS, GRAD_REL, MIN_COSINE = 1e-3, 5e-2, 0.9


def _loss_and_grads(model: torch.nn.Module, forward, tokens: torch.Tensor) -> tuple[float, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = forward(tokens[:, :-1])
    loss = F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())
    loss.backward()
    return loss.item(), {name: p.grad.clone() for name, p in model.named_parameters()}


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_compiles_in_one_graph_and_matches_eager(kind):
    cfg = load_config(None, ["model.size=tiny-3xs", "model.vocab_size=256", f"model.attention.kind={kind}"]).model
    assert cfg.attention.backend.value == "sdpa"
    torch.manual_seed(0)
    model = build_model(cfg, compute_dtype=torch.bfloat16)
    tokens = torch.randint(0, cfg.vocab_size, (2, 33))
    eager_loss, eager = _loss_and_grads(model, model, tokens)
    compiled_loss, compiled = _loss_and_grads(model, torch.compile(model, fullgraph=True), tokens)
    assert compiled_loss == pytest.approx(eager_loss, abs=LOSS_ABS)
    flat_eager = torch.cat([g.flatten() for g in eager.values()])
    flat_compiled = torch.cat([g.flatten() for g in compiled.values()])
    assert (flat_compiled - flat_eager).norm() <= GRAD_REL * flat_eager.norm()
    for name, grad in eager.items():
        assert F.cosine_similarity(compiled[name].flatten(), grad.flatten(), dim=0) >= MIN_COSINE, name
