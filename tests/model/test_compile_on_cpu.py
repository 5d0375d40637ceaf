"""``torch.compile`` of each attention kind's model on the CPU (inductor's C++ code), as
``train.compile`` and ``bench model --compile`` compile them on a GPU (``compile_blocks``): bf16
autocast, the default ``sdpa`` backend, each block in one graph (``fullgraph=True``: a graph break
is an error, not a silent fallback to eager) that every layer reuses."""

from __future__ import annotations

import functools

import pytest
import torch
from torch.nn import functional as F

from diffsweep.config import load_config
from diffsweep.model.compile import compile_blocks, compiled_graphs
from diffsweep.model.transformer import build_model

KINDS = ("transformer", "diff_v1", "diff_v2")

# Compiled vs eager, both under bf16 autocast. Inductor fuses pointwise ops and keeps their
# intermediates in fp32 where eager rounds each op's output to bf16 (unit roundoff 2^-9), so the
# two differ by bf16 rounding, not by fp32's. Measured 2026-11-27: the loss (~5.5, a mean over 64
# tokens) moved by at most 6e-5 (bound 1e-3); the whole gradient by at most 0.6% relative, each
# parameter's by at most 1% (bound 5%). Gradients smaller than 1e-3 of the largest parameter's are
# small differences of large terms, and in bf16 they are rounding noise: DIFF V1's λ vectors got a
# bf16 gradient 10x their fp32 one, and compiled and eager bf16 differed by 24-94% of it depending
# on the FFN size (in fp32, compiled matched eager to 2e-4). So those are held in absolute terms,
# to half the noise floor (SMALL / 2 of the largest gradient's norm): a blow-up fails, bf16 noise
# does not. (The attention backends' dλ is checked against the fp64 reference in tests/model/test_backends.py.)
LOSS_ABS, GRAD_REL, SMALL = 1e-3, 5e-2, 1e-3


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
    # two layers (DIFF V1's λ_init differs between them): one graph serves both
    cfg = load_config(None, ["model.size=tiny-3xs", "model.vocab_size=256", "model.n_layers=2",
                             f"model.attention.kind={kind}"]).model
    assert cfg.attention.backend.value == "sdpa"
    torch.manual_seed(0)
    model = build_model(cfg, compute_dtype=torch.bfloat16)
    tokens = torch.randint(0, cfg.vocab_size, (2, 33))
    eager_loss, eager = _loss_and_grads(model, model, tokens)
    torch._dynamo.reset()
    compile_blocks(model)
    graphs = compiled_graphs()
    with torch._dynamo.config.patch(error_on_recompile=True):
        compiled_loss, compiled = _loss_and_grads(model, model, tokens)
    assert compiled_graphs() - graphs == 1
    assert compiled_loss == pytest.approx(eager_loss, abs=LOSS_ABS)
    flat_eager = torch.cat([g.flatten() for g in eager.values()])
    flat_compiled = torch.cat([g.flatten() for g in compiled.values()])
    assert (flat_compiled - flat_eager).norm() <= GRAD_REL * flat_eager.norm()
    largest = max(g.norm() for g in eager.values())
    for name, grad in eager.items():
        bound = GRAD_REL * grad.norm() if grad.norm() >= SMALL * largest else SMALL / 2 * largest
        assert (compiled[name] - grad).norm() <= bound, name


def test_bench_model_compiles_each_model_once(monkeypatch):
    # A guard on the RoPE table cache, empty at the first call, made every compiled model compile
    # twice (seen on an H200: +70 s per 1.4B model). The benchmark builds the tables first. Guards
    # and recompiles are dynamo's, whatever compiles the graphs: its "eager" backend runs them as
    # traced, without inductor's C++ (the inductor path is checked by the test above).
    from diffsweep.bench.model import run_model

    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))
    torch._dynamo.reset()
    with torch._dynamo.config.patch(error_on_recompile=True):
        result = run_model(size="tiny-3xs", kinds=["transformer"], seq=16, micro_batch=1, steps=1, warmup=1,
                           device="cpu", compile_model=True)
    row = result["rows"][0]
    assert row["reason"] is None, row["reason"]  # a recompile is an error the row reports
    assert row["tokens_per_s"] > 0
