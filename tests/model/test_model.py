"""The model zoo trains: gradients reach every parameter, bf16 autocast runs, backends agree."""

from __future__ import annotations

import re

import pytest
import torch
from torch.nn import functional as F

from diffsweep.config import Backend, EnvironmentUnavailable, load_config
from diffsweep.model.attention.backends import BACKENDS, AttentionBackend, AttentionCall, resolve_backend
from diffsweep.model.transformer import build_model
from tests.helpers.gpu import needs_cuda

KINDS = ["transformer", "diff_v1", "diff_v2"]
SWITCHES = {
    "transformer": [[], ["model.attention.head_norm=rmsnorm", "model.attention.num_kv_heads=2"]],
    "diff_v1": [[], ["model.attention.head_norm=none", "model.attention.lambda_init=constant:0.8",
                     "model.attention.num_kv_heads=1"]],
    "diff_v2": [[], ["model.attention.v2_pairing=cross_group", "model.attention.num_kv_heads=2"],
                ["model.attention.v2_lambda=none"], ["model.attention.v2_lambda=raw"]],
}
CASES = [(kind, sw) for kind, sws in SWITCHES.items() for sw in sws]


def _cfg(kind: str, *overrides: str, backend: str = "sdpa"):
    base = ["model.size=tiny-xs", "model.vocab_size=257", f"model.attention.kind={kind}",
            f"model.attention.backend={backend}"]
    return load_config(None, base + list(overrides)).model


def _loss(model, tokens):
    logits = model(tokens[:, :-1])
    return F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())


@pytest.mark.parametrize(("kind", "switches"), CASES)
def test_gradients_reach_every_parameter(kind, switches):
    torch.manual_seed(0)
    model = build_model(_cfg(kind, *switches))
    _loss(model, torch.randint(0, 257, (2, 17))).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, f"no gradient reaches {name}"
    names = dict(model.named_parameters())
    if kind == "diff_v1":
        assert {"layers.0.attention.lambda_q1", "layers.0.attention.lambda_k2"} <= set(names)
    if kind == "diff_v2" and "model.attention.v2_lambda=none" not in switches:
        assert "layers.0.attention.wlambda.weight" in names


def _bf16_logit_error(kind: str, backend: str, device: str = "cpu") -> tuple[float, torch.Tensor]:
    """Max |bf16-autocast logits - fp32 logits| / max |fp32 logits| for a model with non-trivial
    attention (init_std 0.1), and the bf16 loss (for the backward pass)."""
    torch.manual_seed(0)
    model = build_model(_cfg(kind, "model.init_std=0.1", backend=backend), device=device,
                        compute_dtype=torch.bfloat16)
    tokens = torch.randint(0, 257, (2, 33), generator=torch.Generator().manual_seed(3)).to(device)
    with torch.no_grad():
        fp32 = model(tokens)
    with torch.autocast(device, dtype=torch.bfloat16):
        logits = model(tokens)
    err = ((logits.float() - fp32).abs().max() / fp32.abs().max()).item()
    loss = F.cross_entropy(logits.flatten(0, 1).float(), tokens.flatten())
    return err, loss


@pytest.mark.parametrize("kind", KINDS)
def test_bf16_autocast_forward_backward(kind):
    """bf16 autocast runs forward and backward, with logits as close to fp32 as the reference's."""
    err, loss = _bf16_logit_error(kind, "sdpa")
    loss.backward()
    assert torch.isfinite(loss)
    ref_err, _ = _bf16_logit_error(kind, "reference")
    assert err <= 3 * ref_err + 1e-3, (err, ref_err)
    assert err < 0.1


def _cpu_backends() -> list[str]:
    """Backends that can run a fp32 model on this CPU (triton only inside Triton's interpreter)."""
    return [b.value for b, impl in BACKENDS.items() if impl.unavailable_reason() is None
            and impl.unsupported_reason(AttentionCall(4, 4, 16, 32, True), torch.device("cpu"), torch.float32) is None]


@pytest.mark.parametrize(("kind", "switches"), CASES)
def test_every_available_backend_gives_the_same_loss_and_gradients(kind, switches):
    tokens = torch.randint(0, 257, (2, 33), generator=torch.Generator().manual_seed(1))
    losses, keys, grads = {}, {}, {}
    for backend in _cpu_backends():
        torch.manual_seed(0)
        model = build_model(_cfg(kind, *switches, backend=backend))
        loss = _loss(model, tokens)
        loss.backward()
        losses[backend] = loss.item()
        keys[backend] = list(model.state_dict())  # state_dict keys do not depend on the backend
        grads[backend] = {n: p.grad for n, p in model.named_parameters()}
    assert {"reference", "sdpa"} <= set(losses)
    for backend in losses:
        assert losses[backend] == pytest.approx(losses["reference"], abs=1e-5), backend
        assert keys[backend] == keys["reference"], backend
        for name, grad in grads[backend].items():
            torch.testing.assert_close(grad, grads["reference"][name], atol=1e-5, rtol=1e-4, msg=f"{backend} {name}")


def test_the_triton_backend_is_among_them_in_ci():
    """Without a GPU the tests run the Triton kernel in the interpreter (tests/conftest.py), so a
    missing triton package must not silently drop it from the comparison above."""
    if torch.cuda.is_available():
        pytest.skip("GPU machine: the Triton backend is covered by the GPU tests")
    assert "triton" in _cpu_backends(), BACKENDS[Backend.TRITON].unavailable_reason()


def test_tied_embeddings_share_storage():
    model = build_model(_cfg("transformer"))
    assert model.output is None and model.output_weight() is model.tok_embeddings.weight
    untied = build_model(_cfg("transformer", "model.tie_embeddings=false"))
    assert untied.output.weight is not untied.tok_embeddings.weight


def test_lambda_init_is_fixed_per_layer_and_lambda_vectors_start_near_it():
    torch.manual_seed(0)
    model = build_model(load_config(None, ["model.size=tiny-l", "model.attention.kind=diff_v1"]).model)
    for i, block in enumerate(model.layers, start=1):
        attn = block.attention
        assert attn.lambda_init == pytest.approx(0.8 - 0.6 * torch.exp(torch.tensor(-0.3 * (i - 1))).item())
        assert attn.lambda_q1.std().item() == pytest.approx(0.1, rel=0.5)  # N(0, 0.1), paper §2.1
        # λ - λ_init = exp(λq1·λk1) - exp(λq2·λk2) ~ λq1·λk1 - λq2·λk2: std 0.01·sqrt(2d); allow 6 sigma
        assert abs(attn.lambda_full().item() - attn.lambda_init) < 6 * 0.01 * (2 * attn.head_dim) ** 0.5


@pytest.mark.parametrize("name", list(Backend))
def test_every_backend_name_is_registered(name):
    assert isinstance(BACKENDS[name], AttentionBackend)


@pytest.mark.gpu
def test_triton_backend_refuses_what_the_kernel_cannot_do():
    """Checked on the device the kernel runs on: CUDA when there is one (there a CPU tensor is
    refused for its device first), else the CPU in Triton's interpreter."""
    triton = BACKENDS[Backend.TRITON]
    if triton.unavailable_reason() is not None:
        pytest.skip(f"triton backend {triton.unavailable_reason()}")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    assert "head dims of at most 256" in triton.unsupported_reason(AttentionCall(4, 4, 320, 640, True), device,
                                                                   torch.float32)
    assert triton.unsupported_reason(AttentionCall(4, 4, 24, 48, True), device, torch.float32) is None  # padded
    assert "fp16, bf16 or fp32" in triton.unsupported_reason(AttentionCall(4, 4, 16, 32, True), device,
                                                             torch.float64)
    assert triton.unsupported_reason(AttentionCall(4, 4, 24, 24, False), device, torch.float32) is None  # via SDPA
    if device.type == "cpu":
        assert "bf16" in triton.unsupported_reason(AttentionCall(4, 4, 16, 32, True), device, torch.bfloat16)
    else:
        assert triton.unsupported_reason(AttentionCall(4, 4, 16, 32, True), device, torch.bfloat16) is None
        assert "runs on CUDA devices" in triton.unsupported_reason(AttentionCall(4, 4, 16, 32, True),
                                                                   torch.device("cpu"), torch.float32)
    with pytest.raises(EnvironmentUnavailable, match="model.attention.backend: 'triton' needs head dims of at most"):
        build_model(_cfg("diff_v1", "model.d_model=640", "model.attention.head_dim=320", backend="triton"),
                    device=device)


@pytest.mark.gpu
def test_flash_backend_fails_at_build_time_with_the_reason_without_gpu():
    """Without a GPU, or (on the GPU machine) without the flash-attn package: the reasons differ."""
    reason = BACKENDS[Backend.FLASH].unavailable_reason()
    if reason is None:
        pytest.skip("flash-attn and a CUDA GPU are present; covered by the GPU tests")
    call = AttentionCall(4, 4, 16, 32, differential=True)
    with pytest.raises(EnvironmentUnavailable, match=re.escape(f"model.attention.backend: 'flash' {reason}")):
        resolve_backend(Backend.FLASH, call, device="cpu", dtype=torch.float32)
    with pytest.raises(EnvironmentUnavailable, match="model.attention.backend: 'flash'"):
        build_model(_cfg("diff_v1", backend="flash"))


def test_flash_backend_refuses_fp32_and_cpu_inputs():
    flash = BACKENDS[Backend.FLASH]
    call = AttentionCall(4, 4, 16, 32, differential=True)
    assert "CUDA" in flash.unsupported_reason(call, torch.device("cpu"), torch.bfloat16)
    assert "fp16/bf16" in flash.unsupported_reason(call, torch.device("cuda"), torch.float32)
    assert flash.unsupported_reason(call, torch.device("cuda"), torch.bfloat16) is None


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("kind", KINDS)
def test_gpu_bf16_autocast_matches_reference_error(kind):
    err, loss = _bf16_logit_error(kind, "sdpa", device="cuda")
    loss.backward()
    ref_err, _ = _bf16_logit_error(kind, "reference", device="cuda")
    assert torch.isfinite(loss) and err <= 3 * ref_err + 1e-3, (err, ref_err)


@pytest.mark.parametrize(("kind", "switches"), CASES)
def test_models_pickle(kind, switches, tmp_path):
    """Whole modules survive torch.save/load (no lambdas or closures in module state)."""
    model = build_model(_cfg(kind, *switches))
    torch.save(model, tmp_path / "m.pt")
    again = torch.load(tmp_path / "m.pt", weights_only=False)
    tokens = torch.randint(0, 257, (1, 9))
    assert torch.equal(model(tokens), again(tokens))
