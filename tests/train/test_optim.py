"""The optimisation recipe: learning-rate schedules (linear, cosine, warmup-stable-decay), the
step budget, and AdamW parameter groups (weight decay on matrices only) on real tiny models."""

from __future__ import annotations

import math

import pytest
import torch

from diffsweep.config import LRSchedule, load_config
from diffsweep.model.transformer import build_model
from diffsweep.train.optim import build_optimizer, lr_at

LR, MIN_LR = 1e-3, 1e-5


def _train(*sets: str):
    return load_config(None, ["train.max_steps=100", "train.warmup_steps=10", f"train.lr={LR}",
                              f"train.min_lr={MIN_LR}", *sets]).train


def _schedule(cfg) -> list[float]:
    return [lr_at(step, cfg) for step in range(1, cfg.total_steps + 1)]


@pytest.mark.parametrize("schedule", list(LRSchedule))
def test_warmup_is_linear_and_exact(schedule):
    """Step s of the warmup (1-based) has lr * s / warmup_steps, reaching lr at the last one."""
    cfg = _train(f"train.schedule={schedule.value}")
    for step in range(1, 11):
        assert lr_at(step, cfg) == LR * step / 10
    assert lr_at(10, cfg) == LR


@pytest.mark.parametrize("schedule", list(LRSchedule))
def test_decay_is_monotone_and_ends_at_min_lr(schedule):
    """After warmup the rate never rises, ends exactly at min_lr on the last step, stays above it
    before, and falls strictly across the decay."""
    cfg = _train(f"train.schedule={schedule.value}")
    lrs = _schedule(cfg)
    after = lrs[10:]
    assert all(a >= b for a, b in zip(after, after[1:]))
    assert lrs[-1] == MIN_LR
    assert all(lr > MIN_LR for lr in lrs[:-1])
    assert after[0] > after[-1]


def test_linear_values():
    """Linear: lr - (lr - min_lr) * (s - warmup) / (n - warmup)."""
    cfg = _train("train.schedule=linear")
    for step in range(11, 101):
        assert lr_at(step, cfg) == pytest.approx(LR - (LR - MIN_LR) * (step - 10) / 90, rel=1e-12)
    assert lr_at(55, cfg) == pytest.approx((LR + MIN_LR) / 2, rel=1e-12)


def test_cosine_values():
    """Cosine: min_lr + (lr - min_lr) * (1 + cos(pi * progress)) / 2, half-way at the midpoint."""
    cfg = _train("train.schedule=cosine")
    for step in range(11, 101):
        expected = MIN_LR + (LR - MIN_LR) * 0.5 * (1 + math.cos(math.pi * (step - 10) / 90))
        assert lr_at(step, cfg) == pytest.approx(expected, rel=1e-12)
    assert lr_at(55, cfg) == pytest.approx((LR + MIN_LR) / 2, rel=1e-12)
    assert lr_at(20, cfg) > lr_at(20, _train("train.schedule=linear"))  # cosine stays higher early


def test_wsd_constant_then_linear_decay():
    """WSD: lr held constant until the last decay_fraction of steps, then linear to min_lr."""
    cfg = _train("train.schedule=wsd", "train.decay_fraction=0.2")
    lrs = _schedule(cfg)
    assert all(lr == LR for lr in lrs[9:80])  # steps 10..80
    for step in range(81, 101):  # the last 20 steps decay linearly
        assert lr_at(step, cfg) == pytest.approx(LR - (LR - MIN_LR) * (step - 80) / 20, rel=1e-12)
    assert lrs[-1] == MIN_LR


@pytest.mark.parametrize("schedule,shape", [("wsd_sqrt", lambda p: 1 - math.sqrt(p)),
                                             ("wsd_cosine", lambda p: 0.5 * (1 + math.cos(math.pi * p)))])
def test_wsd_cooldown_shapes(schedule, shape):
    """The 1 - sqrt and cosine cooldowns: the same stable phase as wsd, then min_lr + (lr - min_lr) *
    shape(progress) over the last decay_fraction of steps."""
    cfg = _train(f"train.schedule={schedule}", "train.decay_fraction=0.2")
    assert _schedule(cfg)[:80] == _schedule(_train("train.schedule=wsd", "train.decay_fraction=0.2"))[:80]
    for step in range(81, 101):
        assert lr_at(step, cfg) == pytest.approx(MIN_LR + (LR - MIN_LR) * shape((step - 80) / 20), rel=1e-12)
    assert lr_at(85, cfg) != pytest.approx(lr_at(85, _train("train.schedule=wsd")), rel=1e-3)


def test_wsd_full_decay_fraction_is_linear():
    """decay_fraction 1.0: decay starts right after warmup, as the linear schedule."""
    wsd = _schedule(_train("train.schedule=wsd", "train.decay_fraction=1.0"))
    assert wsd == pytest.approx(_schedule(_train("train.schedule=linear")), rel=1e-12)


@pytest.mark.parametrize("max_steps,fraction", [(4, 0.1), (2, 0.2), (10, 0.04)])
def test_wsd_short_run_still_reaches_min_lr(max_steps, fraction):
    """When decay_fraction * n rounds to zero steps, the last step still decays to min_lr."""
    cfg = _train(f"train.max_steps={max_steps}", "train.warmup_steps=1", "train.schedule=wsd",
                 f"train.decay_fraction={fraction}")
    lrs = _schedule(cfg)
    assert lrs[-1] == MIN_LR
    assert all(lr == LR for lr in lrs[:-1])


def test_total_steps_from_max_tokens():
    """max_tokens rounds up to whole batches; the schedule then ends at min_lr on that step."""
    base = ["train.max_steps=null", "train.seq_len=64", "train.batch_tokens=4096", "train.warmup_steps=10"]
    cfg = load_config(None, [*base, "train.max_tokens=1000000", f"train.min_lr={MIN_LR}"]).train
    assert cfg.total_steps == 245  # 1e6 / 4096 = 244.1
    assert lr_at(245, cfg) == MIN_LR and lr_at(244, cfg) > MIN_LR
    assert load_config(None, [*base, "train.max_tokens=409600"]).train.total_steps == 100
    assert _train().total_steps == 100


# --- parameter groups ----------------------------------------------------------------------------

TINY = ["model.size=tiny-xs", "model.vocab_size=512"]


def _model(*sets: str):
    cfg = load_config(None, [*TINY, *sets])
    torch.manual_seed(0)
    return build_model(cfg.model), cfg.train


def _groups(model, optimizer) -> tuple[set[str], set[str]]:
    names = {id(p): n for n, p in model.named_parameters()}
    decay = [g for g in optimizer.param_groups if g["weight_decay"] > 0]
    no_decay = [g for g in optimizer.param_groups if g["weight_decay"] == 0]
    assert len(decay) == len(no_decay) == 1
    return {names[id(p)] for p in decay[0]["params"]}, {names[id(p)] for p in no_decay[0]["params"]}


def _expected_no_decay(name: str) -> bool:
    """The rule written out by name: norm gains, V1's λ vectors and V2's λ projection."""
    leaf = name.rsplit(".", 2)
    return (name.endswith("norm.weight") or leaf[-1] in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2")
            or name.endswith("wlambda.weight"))


@pytest.mark.parametrize(
    "sets",
    [
        ["model.attention.kind=transformer"],
        ["model.attention.kind=transformer", "model.attention.head_norm=rmsnorm", "model.tie_embeddings=false"],
        ["model.attention.kind=diff_v1"],
        ["model.attention.kind=diff_v2"],
        ["model.attention.kind=diff_v2", "model.attention.v2_lambda=none"],
    ],
    ids=["transformer", "transformer-headnorm-untied", "diff_v1", "diff_v2", "diff_v2-no-lambda"],
)
def test_param_groups(sets):
    """Every trainable parameter is in exactly one group; decay goes to every matrix except V2's λ
    projection; norms and λ get none; the groups carry the config's hyper-parameters."""
    model, t = _model(*sets)
    opt = build_optimizer(model, t)
    decay, no_decay = _groups(model, opt)
    names = [n for n, _ in model.named_parameters()]
    assert len(names) == len(set(names)) == len(decay) + len(no_decay)
    assert decay == {n for n in names if not _expected_no_decay(n)}
    assert no_decay == {n for n in names if _expected_no_decay(n)}
    params = dict(model.named_parameters())
    assert all(params[n].ndim >= 2 for n in decay)
    assert "tok_embeddings.weight" in decay
    assert ("output.weight" in decay) == ("model.tie_embeddings=false" in sets)
    assert {"layers.0.attention_norm.weight", "layers.1.ffn_norm.weight", "norm.weight"} <= no_decay
    group = next(g for g in opt.param_groups if g["weight_decay"] > 0)
    assert (group["weight_decay"], group["lr"], group["betas"], group["eps"]) == (t.weight_decay, t.lr,
                                                                                  tuple(t.betas), t.eps)


def test_kind_specific_no_decay_names():
    """V1's four λ vectors and V2's wlambda.weight (a matrix, excluded by name) get no decay;
    a per-head norm gain gets none either."""
    v1, t = _model("model.attention.kind=diff_v1")
    _, no_decay = _groups(v1, build_optimizer(v1, t))
    for layer in (0, 1):
        for leaf in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2", "head_norm.weight"):
            assert f"layers.{layer}.attention.{leaf}" in no_decay
    v2, t = _model("model.attention.kind=diff_v2")
    decay, no_decay = _groups(v2, build_optimizer(v2, t))
    assert v2.layers[0].attention.wlambda.weight.ndim == 2
    assert {"layers.0.attention.wlambda.weight", "layers.1.attention.wlambda.weight"} <= no_decay
    assert "layers.0.attention.wq.weight" in decay


def test_adamw_step_decays_only_the_decay_group():
    """With zero gradients an AdamW step only applies weight decay: matrices shrink by
    (1 - lr * wd), norms and λ stay exactly as they were."""
    model, _ = _model("model.attention.kind=diff_v2")
    t = load_config(None, [*TINY, "train.lr=0.1", "train.weight_decay=0.5"]).train
    opt = build_optimizer(model, t)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    for name, p in model.named_parameters():
        factor = 1.0 if _expected_no_decay(name) else 1 - 0.1 * 0.5
        torch.testing.assert_close(p.detach(), before[name] * factor, rtol=1e-6, atol=0, msg=name)


def test_frozen_parameters_are_left_out():
    """Parameters with requires_grad=False are not handed to the optimizer."""
    model, t = _model()
    model.tok_embeddings.weight.requires_grad_(False)
    opt = build_optimizer(model, t)
    handed = {id(p) for g in opt.param_groups for p in g["params"]}
    assert id(model.tok_embeddings.weight) not in handed
    assert len(handed) == sum(1 for p in model.parameters() if p.requires_grad)
