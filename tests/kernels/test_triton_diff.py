"""The fused Triton DIFF V1 kernel (``diffsweep_kernels.triton_diff``) on its own: shapes and
layouts a model hands it, edge lengths, λ of any sign, the custom-op registration, and (on a GPU)
torch.compile. Without a GPU it runs in Triton's interpreter (switched on in tests/conftest.py).

The tolerance is relative to the reference's own error at the same precision (house rule 10):
``err(kernel) <= 2 * err(reference in that dtype) + a few ulps``, both against an fp64 reference.
"""

from __future__ import annotations

import os

import pytest
import torch

from tests.helpers.gpu import needs_cuda, skip_or_fail

pytest.importorskip("triton", reason="the triton package is not installed (pip install triton)")

from diffsweep_kernels import reference, triton_configs, triton_diff  # noqa: E402

# Every test here runs on the GPU when there is one (in Triton's interpreter otherwise).
pytestmark = pytest.mark.gpu

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu" and not triton_diff.INTERPRET:
    skip_or_fail("no GPU and TRITON_INTERPRET is not set (tests/conftest.py sets it)")



def _inputs(B, H, Hkv, T, D, Dv, lam=0.6, seed=0):
    g = torch.Generator().manual_seed(seed)
    q1, q2 = (torch.randn(B, H, T, D, generator=g) * 2 for _ in range(2))
    k1, k2 = (torch.randn(B, Hkv, T, D, generator=g) * 2 for _ in range(2))
    v = torch.randn(B, Hkv, T, Dv, generator=g)
    return [q1, k1, q2, k2, v, torch.tensor(lam)]


def _out_and_grads(fn, tensors, dtype):
    return reference.outputs_and_grads(fn, tensors, dtype, DEVICE)


def _kernel(q1, k1, q2, k2, v, lam):
    return triton_diff.diff_attention(q1, k1, q2, k2, v, lam, scale=q1.shape[-1] ** -0.5)


def _reference(q1, k1, q2, k2, v, lam):
    return reference.diff_attention(q1, k1, q2, k2, v, lam, scale=q1.shape[-1] ** -0.5, upcast=True)


def assert_matches_reference(tensors, dtype, kernel=_kernel):
    truth = _out_and_grads(_reference, tensors, torch.float64)
    ref_low = _out_and_grads(_reference, tensors, dtype)
    got = _out_and_grads(kernel, tensors, dtype)
    for name, check in reference.compare(truth, ref_low, got, dtype).items():
        assert check["finite"], f"{name}: non-finite values"
        assert check["ok"], f"{name}: err {check['err']:.2e} vs reference {check['ref_err']:.2e}"


DTYPES = [torch.float32, torch.float16]  # bf16: GPU only (the interpreter computes it wrongly)
if DEVICE == "cuda":
    DTYPES.append(torch.bfloat16)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    ("B", "H", "Hkv", "T", "D", "Dv"),
    [
        (1, 1, 1, 1, 16, 32),  # one token
        (1, 2, 2, 16, 16, 32),  # exactly one tile
        (1, 2, 2, 17, 16, 32),  # one past a tile
        (2, 4, 1, 70, 16, 32),  # GQA 4:1, several tiles with a ragged tail
        (1, 2, 1, 48, 32, 64),  # wider heads
        (1, 2, 2, 40, 16, 16),  # V as wide as Q/K
        (1, 2, 1, 33, 24, 48),  # head dims that are not powers of two (padded tiles, masked)
        (1, 2, 2, 20, 8, 16),  # head dims below tl.dot's minimum of 16
    ],
)
def test_output_and_every_gradient_match_the_reference(B, H, Hkv, T, D, Dv, dtype):
    assert_matches_reference(_inputs(B, H, Hkv, T, D, Dv), dtype)


@pytest.mark.parametrize("lam", [-0.3, 0.0, 1.0])
def test_lambda_of_any_sign_and_its_gradient(lam):
    assert_matches_reference(_inputs(1, 2, 1, 33, 16, 32, lam=lam), torch.float32)


def test_strided_inputs_as_diff_v1_hands_them_over():
    """DIFF V1 passes q1/q2 and k1/k2 as slices of one projection (non-contiguous) and V as a
    transposed view; the kernel reads them through their strides and still matches."""
    B, T, h, hkv, d = 2, 37, 4, 2, 16
    g = torch.Generator().manual_seed(3)
    q_proj = torch.randn(B, T, h, 2, d, generator=g) * 2
    k_proj = torch.randn(B, T, hkv, 2, d, generator=g) * 2
    v_proj = torch.randn(B, T, hkv, 2 * d, generator=g)

    def split(qp, kp, vp, lam):  # as DiffAttentionV1.forward lays them out
        q, k = qp.permute(3, 0, 2, 1, 4), kp.permute(3, 0, 2, 1, 4)
        return q[0], k[0], q[1], k[1], vp.transpose(1, 2), lam

    def kernel(qp, kp, vp, lam):
        args = split(qp, kp, vp, lam)
        assert not args[0].is_contiguous() and not args[4].is_contiguous()
        return _kernel(*args)

    def ref(qp, kp, vp, lam):
        return _reference(*split(qp, kp, vp, lam))

    tensors = [q_proj, k_proj, v_proj, torch.tensor(0.7)]
    truth = _out_and_grads(ref, tensors, torch.float64)
    got = _out_and_grads(kernel, tensors, torch.float32)
    for name, t, g in zip(["out", "dq", "dk", "dv", "dlam"], truth, got):
        assert (g - t).abs().max().item() < 1e-4 * max(1.0, t.abs().max().item()), name


def test_a_wrong_kernel_fails_the_comparison():
    """The comparison catches a kernel that drops the second map's gradient (not a test that cannot fail)."""

    def no_map2_gradient(q1, k1, q2, k2, v, lam):
        return _kernel(q1, k1, q2.detach(), k2, v, lam)

    with pytest.raises(AssertionError, match="dq2"):
        assert_matches_reference(_inputs(1, 2, 2, 20, 16, 32), torch.float32, kernel=no_map2_gradient)


def test_bad_shapes_are_refused_with_the_shapes():
    """On the device the kernel runs on (on a GPU, CPU tensors are refused for their device first)."""
    q1, k1, q2, k2, v, lam = (t.to(DEVICE) for t in _inputs(1, 2, 2, 8, 16, 32))
    with pytest.raises(ValueError, match=r"diff_attention: bad shapes q1 \(1, 2, 8, 16\)"):
        triton_diff.diff_attention(q1, k1, q2[:, :1], k2, v, lam, scale=0.25)
    q1, k1, q2, k2, v, lam = (t.to(DEVICE) for t in _inputs(1, 2, 2, 8, 320, 640))
    with pytest.raises(ValueError, match="needs head dims of at most 256"):
        triton_diff.diff_attention(q1, k1, q2, k2, v, lam, scale=0.25)


def test_registered_as_a_custom_op_with_autograd():
    """``diffsweep::diff_attention_fwd`` is a torch op with its autograd formula registered
    (what torch.compile needs). Fake-tensor tracing runs on GPU only: in the interpreter
    ``wrap_triton`` hands back the raw kernel, which cannot take fake tensors."""
    op = torch.ops.diffsweep.diff_attention_fwd.default
    q1, k1, q2, k2, v, lam = (t.requires_grad_() for t in _inputs(1, 2, 1, 20, 16, 32))
    utils = ("test_schema", "test_autograd_registration")
    if DEVICE == "cuda":
        utils += ("test_faketensor", "test_aot_dispatch_dynamic")
        q1, k1, q2, k2, v, lam = (t.detach().cuda().requires_grad_() for t in (q1, k1, q2, k2, v, lam))
    result = torch.library.opcheck(op, (q1, k1, q2, k2, v, lam, 0.25), test_utils=utils)
    assert result == {name: "SUCCESS" for name in utils}


@needs_cuda  # torch.compile of Triton ops
def test_torch_compile_traces_a_diff_v1_model_using_the_kernel():
    from torch.nn import functional as F

    from diffsweep.config import load_config
    from diffsweep.model.transformer import build_model

    cfg = load_config(None, ["model.size=tiny-l", "model.vocab_size=512", "model.attention.kind=diff_v1",
                             "model.attention.backend=triton"]).model
    torch.manual_seed(0)
    model = build_model(cfg, device="cuda", compute_dtype=torch.bfloat16)
    tokens = torch.randint(0, 512, (2, 257), device="cuda")

    def loss_of(m):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = m(tokens[:, :-1])
        return F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())

    eager = loss_of(model)
    compiled = loss_of(torch.compile(model, fullgraph=True))
    assert compiled.item() == pytest.approx(eager.item(), abs=2e-2)


def test_wide_v_configs_are_pruned_as_the_autotuner_calls_the_pruner():
    """On a GPU the autotuner calls ``early_config_prune(configs, positional_args, **keyword_args)``;
    DV is a keyword there. Wide V keeps only tiles whose two accumulators fit."""
    configs = [triton_diff.triton.Config({"BLOCK_M": m, "BLOCK_N": n}) for m, n in [(128, 64), (64, 64), (64, 32)]]
    kept = triton_configs.prune_wide_v(configs, {"Q1": None, "T": 2048}, **triton_diff._dims(1, 128, 256, torch.bfloat16))
    assert [c.kwargs["BLOCK_M"] for c in kept] == [64, 64]
    assert triton_configs.prune_wide_v(configs, {"T": 2048}, **triton_diff._dims(1, 96, 192, torch.bfloat16)) == kept
    assert triton_configs.prune_wide_v(configs, {"T": 2048}, **triton_diff._dims(1, 64, 128, torch.bfloat16)) == configs


def test_every_config_keeps_the_tiles_left_of_the_diagonal_whole():
    """The forward and dQ loops skip the causal mask left of the diagonal, which is only right when
    a query tile is a whole number of key tiles (and in dK/dV a key tile of query steps)."""
    interpreted = [(32, 16, 4, 1), (16, 32, 4, 1)]
    for m, n, _, _ in triton_configs.FWD_BLOCKS + triton_configs.DQ_BLOCKS + interpreted[:1]:
        assert m % n == 0, (m, n)
    for m, n, _, _ in triton_configs.DKDV_BLOCKS + interpreted[1:]:
        assert n % m == 0, (m, n)
    assert [(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"]) for c in triton_configs.ALL_CONFIGS["fwd"]] == (
        [(32, 16)] if triton_diff.INTERPRET else [b[:2] for b in triton_configs.FWD_BLOCKS])


# --- Autotuning: DIFFSWEEP_TRITON_AUTOTUNE, pinned configs, every config at the 1.4B head shape ---

BLOCKS = {"fwd": triton_configs.FWD_BLOCKS, "dkdv": triton_configs.DKDV_BLOCKS, "dq": triton_configs.DQ_BLOCKS}


def _config(block: tuple[int, int, int, int]):
    m, n, warps, stages = block
    return triton_diff.triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=warps, num_stages=stages)


def test_autotune_mode_is_read_from_the_environment_and_checked():
    assert triton_configs.autotune_mode() == os.environ.get(triton_configs.AUTOTUNE_ENV, "all")  # "first" (conftest)
    assert triton_configs.read_autotune_mode(None) == "all"
    assert triton_configs.read_autotune_mode("first") == "first"
    with pytest.raises(ValueError, match=r"^DIFFSWEEP_TRITON_AUTOTUNE: expected one of \[all, first\], got 'one'$"):
        triton_configs.read_autotune_mode("one")
    expected = {name: len(configs) if triton_configs.autotune_mode() == "all" else 1
                for name, configs in triton_configs.ALL_CONFIGS.items()}
    assert {name: len(configs) for name, configs in triton_configs.CONFIGS.items()} == expected


def test_first_mode_keeps_per_kernel_the_first_config_that_fits_the_widest_v():
    """With one config the autotuner runs it without pruning, so it must fit V dims up to 512."""
    first = {name: triton_configs.first_that_fits_every_shape([_config(b) for b in blocks])
             for name, blocks in BLOCKS.items()}
    assert {name: [triton_configs.format_config(c) for c in configs] for name, configs in first.items()} == {
        "fwd": ["BLOCK_M=64 BLOCK_N=64 warps=8 stages=2"],
        "dkdv": ["BLOCK_M=16 BLOCK_N=64 warps=8 stages=2"],
        "dq": ["BLOCK_M=64 BLOCK_N=64 warps=8 stages=2"],
    }
    for name, (config,) in first.items():  # ... and the autotuner's own pruner keeps it at the widest V
        assert triton_configs.prune_wide_v([_config(b) for b in BLOCKS[name]], {"T": 64},
                                         **triton_diff._dims(1, 256, 512, torch.bfloat16))[0] == config


def test_a_pinned_config_runs_and_is_reported_as_chosen(monkeypatch):
    """``pinned_config`` makes the autotuner run one given config (here, smaller tiles than the
    interpreter's own), ``chosen_configs`` reports it, and the kernel still matches the reference."""
    pinned = triton_diff.triton.Config({"BLOCK_M": 16, "BLOCK_N": 16}, num_warps=4, num_stages=1)
    monkeypatch.delattr(triton_diff.AUTOTUNED["dq"], "best_config", raising=False)
    assert triton_diff.chosen_configs()["dq"] is None  # before its first call
    before = triton_diff.AUTOTUNED["dq"].configs
    with triton_diff.pinned_config("dq", pinned):
        assert_matches_reference(_inputs(1, 2, 1, 37, 16, 32), torch.float32)
    assert triton_diff.AUTOTUNED["dq"].configs is before
    chosen = triton_diff.chosen_configs()
    assert chosen["dq"] == "BLOCK_M=16 BLOCK_N=16 warps=4 stages=1"
    assert chosen["fwd"] in [triton_configs.format_config(c) for c in triton_configs.CONFIGS["fwd"]]


@needs_cuda
@pytest.mark.parametrize(("kernel", "block"), [(name, b) for name, blocks in BLOCKS.items() for b in blocks],
                         ids=lambda x: "x".join(map(str, x)) if isinstance(x, tuple) else x)
def test_every_config_matches_the_reference_at_the_1_4b_head_shape(kernel, block):
    """The correctness tests run one config per kernel (DIFFSWEEP_TRITON_AUTOTUNE=first); this runs
    each config of each kernel, pinned, at the 1.4B DIFF V1 heads (Q/K 128, V 256, 8 heads) in bf16.
    T = 1008 = 16·63 leaves a ragged tail for every tile of 32 and more; being a multiple of 16, it
    gets the same Triton specialization as the device kit's smoke stage (T = 2048, every config
    compiled), so on the GPU machine these compiles come from Triton's cache. A config the
    autotuner prunes at this shape never runs there: it is reported as pruned, not run."""
    B, H, T, D, Dv = 1, 8, 1008, 128, 256
    config = _config(block)
    kept = triton_configs.prune_wide_v([_config(b) for b in BLOCKS[kernel]], {"T": T},
                                     **triton_diff._dims(1, D, Dv, torch.bfloat16))
    if triton_configs.format_config(config) not in {triton_configs.format_config(c) for c in kept}:
        assert not triton_configs.tile_fits(block[0], block[1], Dv)
        pytest.skip(f"pruned at V dim {Dv}: {block[0]}x{block[1]} tiles do not fit (tile_fits), never run there")
    with triton_diff.pinned_config(kernel, config):
        assert_matches_reference(_inputs(B, H, H, T, D, Dv), torch.bfloat16)
        assert triton_diff.chosen_configs()[kernel] == triton_configs.format_config(config)
