"""``diffsweep.eval.tap``: the absmax quantizer on hand-made logits, 16 bits (and None) bit for bit
the untapped model, the observer's logits against this file's own q·kᵀ·scale from each module's
``project``, the quantized explicit path against this file's own quantize-softmax-V (DIFF V1:
both maps, combined with λ), and the backends restored after the ``with``, also on an error."""

from __future__ import annotations

import pytest
import torch

from diffsweep.config import load_config
from diffsweep.eval.tap import Granularity, Tap, causal_mask, quantize_logits, replacement_note, tapped
from diffsweep.model.transformer import build_model
from tests.eval.tiny import KINDS

torch.set_num_threads(1)

B, T = 2, 12


def build(kind: str, seed: int = 0):
    """A tiny-xs model with random weights, larger than the init (attention far from uniform)."""
    cfg = load_config(None, ["model.size=tiny-xs", "model.vocab_size=64", *KINDS[kind]]).model
    model = build_model(cfg).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not name.endswith("norm.weight"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    return model


def tokens(seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 64, (B, T), generator=torch.Generator().manual_seed(seed))


# --- the quantizer ------------------------------------------------------------------------------


def test_quantize_hand_made():
    causal = causal_mask(2, torch.device("cpu"))
    logits = torch.tensor([
        [[[3.0, 50.0], [-1.4, 2.5]],  # absmax 3 over causal positions (50 is masked): scale 1 at 3 bits
         [[0.0, 0.0], [0.0, 0.0]]],  # all zeros: stays zero
        [[[0.75, 9.0], [-1.5, 0.4]],  # absmax 1.5: scale 0.5
         [[-6.0, 1.0], [2.0, 4.5]]],  # absmax 6: scale 2
    ])
    q = quantize_logits(logits, causal, bits=3)  # levels: 2^2 − 1 = 3
    assert q[0, 0, 0, 0] == 3.0 and q[0, 0, 1].tolist() == [-1.0, 2.0]  # 2.5 -> 2 (half to even)
    assert q[0, 1].abs().sum() == 0
    assert q[1, 0, 0, 0] == 1.0 and q[1, 0, 1].tolist() == [-1.5, 0.5]  # 0.75/0.5 = 1.5 -> 2; 0.4 -> 0.5
    assert q[1, 1, 0, 0] == -6.0 and q[1, 1, 1].tolist() == [2.0, 4.0]  # 4.5/2 = 2.25 -> 2
    # 2 bits: one level each side (scale = absmax): sign of values above half the absmax, else 0.
    q2 = quantize_logits(logits, causal, bits=2)
    assert q2[0, 0].tolist()[1] == [-0.0, 3.0] and q2[0, 0, 0, 0] == 3.0  # -1.4/3 -> -0; 2.5/3 -> 1
    assert q2[1, 1, 1].tolist() == [0.0, 6.0]


def direct_quantize(logits: torch.Tensor, bits: int, granularity: str) -> torch.Tensor:
    """This file's own absmax quantizer, one group at a time in plain Python loops: a group is one
    sequence (tensor), one head of a sequence (head) or one query row of a head (row); its scale is
    the largest |logit| at the group's causal positions (s <= t) over 2^(bits-1) - 1."""
    levels = 2 ** (bits - 1) - 1
    num_b, num_h, num_t, _ = logits.shape
    out = torch.empty_like(logits)

    def group_max(b: int, hs: range, ts: range) -> float:
        return max(abs(float(logits[b, h, t, s])) for h in hs for t in ts for s in range(t + 1))

    for b in range(num_b):
        for h in range(num_h):
            for t in range(num_t):
                hs = range(num_h) if granularity == "tensor" else range(h, h + 1)
                ts = range(t, t + 1) if granularity == "row" else range(num_t)
                scale = group_max(b, hs, ts) / levels or 1.0  # a group of zeros stays zero
                for s in range(num_t):
                    out[b, h, t, s] = round(float(logits[b, h, t, s]) / scale) * scale
    return out


@pytest.mark.parametrize("granularity", list(Granularity))
def test_each_granularity_against_a_direct_computation(granularity):
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(2, 3, 5, 5, generator=gen, dtype=torch.float64) * torch.tensor([1.0, 4.0, 0.2],
                                                                                        dtype=torch.float64)[:, None, None]
    logits[1, 2] = 0.0  # an all-zero head
    causal = causal_mask(5, torch.device("cpu"))
    for bits in (2, 4, 8):
        got = quantize_logits(logits, causal, bits, granularity)
        want = direct_quantize(logits, bits, granularity.value)
        assert torch.allclose(got[..., causal], want[..., causal], rtol=1e-12, atol=0), (granularity, bits)


def test_granularities_differ_where_the_scales_do():
    """One large head: per tensor it coarsens the small heads' grid, per head or row it does not."""
    causal = causal_mask(2, torch.device("cpu"))
    logits = torch.tensor([[[[0.3, 0.0], [0.2, 0.1]], [[30.0, 0.0], [-20.0, 10.0]]]])  # (1, 2, 2, 2)
    per_tensor = quantize_logits(logits, causal, 4, Granularity.TENSOR)  # scale 30 / 7: head 0 rounds to 0
    per_head = quantize_logits(logits, causal, 4, Granularity.HEAD)  # head 0's scale 0.3 / 7
    per_row = quantize_logits(logits, causal, 4, Granularity.ROW)  # row 1 of head 1: scale 20 / 7
    assert per_tensor[0, 0].abs().sum() == 0 and per_head[0, 0, 0, 0] == pytest.approx(0.3)
    assert per_head[0, 1, 1, 1] == pytest.approx(30 / 7 * 2) and per_row[0, 1, 1, 1] == pytest.approx(20 / 7 * 4)


def test_bits_out_of_range_refused():
    model = build("transformer")
    inner = model.blocks()[0].attention.backend
    for bits in (1, 17, 0):
        with pytest.raises(ValueError, match="bits"):
            Tap(inner, 1, bits=bits)


# --- 16 bits is the untapped model -------------------------------------------------------------


@pytest.mark.parametrize("kind", list(KINDS))
@torch.no_grad()
def test_16_bits_and_observing_are_bit_for_bit_the_model(kind):
    model = build(kind)
    x = tokens()
    backends = [block.attention.backend for block in model.blocks()]
    plain = model(x)
    seen: list[int] = []
    for bits in (None, 16):
        with tapped(model, observer=lambda layer, logits, causal: seen.append(layer), bits=bits) as taps:
            assert [block.attention.backend for block in model.blocks()] == taps
            assert torch.equal(model(x), plain)
    assert [block.attention.backend for block in model.blocks()] == backends
    calls = 2 if kind == "diff_v1" else 1  # V1: both maps
    assert seen == [layer for layer in (1, 2) for _ in range(calls)] * 2


@torch.no_grad()
def test_backends_restored_on_error():
    model = build("diff_v1")
    backends = [block.attention.backend for block in model.blocks()]
    with pytest.raises(RuntimeError, match="boom"), tapped(model, bits=4):
        raise RuntimeError("boom")
    assert [block.attention.backend for block in model.blocks()] == backends


# --- what the observer sees ---------------------------------------------------------------------


def own_logits(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """q kᵀ / √d per query head, K head j // (Hq / Hkv), written out head by head."""
    group = q.shape[1] // k.shape[1]
    heads = [q[:, j] @ k[:, j // group].transpose(-1, -2) for j in range(q.shape[1])]
    return torch.stack(heads, dim=1) * q.shape[-1] ** -0.5


def module_inputs(model, x_tokens):
    """Each attention module's (module, normalised input) from one forward, via pre-hooks."""
    found = []
    handles = [block.attention.register_forward_pre_hook(lambda m, inputs: found.append((m, inputs[0])))
               for block in model.blocks()]
    model(x_tokens)
    for handle in handles:
        handle.remove()
    return found


def qk_pairs(kind, attention, x, rope):
    """The (q, k) pairs of each map the module computes, from its ``project``."""
    inputs = attention.project(x, rope)
    if kind == "diff_v1":
        q1, k1, q2, k2, _ = inputs
        return [(q1, k1), (q2, k2)]
    return [(inputs[0], inputs[1])]


@pytest.mark.parametrize("kind", list(KINDS))
@torch.no_grad()
def test_observer_sees_the_logits(kind):
    model = build(kind)
    x = tokens()
    rope = model.rope(T, x.device)
    expected = [own_logits(q, k) for attention, h in module_inputs(model, x) for q, k in qk_pairs(kind, attention, h, rope)]
    seen = []
    with tapped(model, observer=lambda layer, logits, causal: seen.append((layer, logits, causal))):
        model(x)
    assert len(seen) == len(expected)
    heads = {"transformer": 4, "diff_v1": 2, "diff_v2": 8}[kind]
    for (_layer, logits, causal), want in zip(seen, expected, strict=True):
        assert logits.shape == (B, heads, T, T) and logits.dtype == torch.float32
        assert torch.equal(causal, torch.ones(T, T, dtype=torch.bool).tril())
        assert torch.allclose(logits, want, rtol=1e-5, atol=1e-5)
    assert [layer for layer, _, _ in seen] == sorted(layer for layer, _, _ in seen)


# --- the quantized explicit path ----------------------------------------------------------------


def own_quantized_attention(q, k, v, bits):
    """Absmax-quantized causal attention written out per (batch, head) slice, fp32."""
    logits = own_logits(q, k)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    group = q.shape[1] // v.shape[1]
    out = torch.empty(q.shape[0], q.shape[1], T, v.shape[-1])
    for b in range(q.shape[0]):
        for j in range(q.shape[1]):
            s = logits[b, j]
            scale = s[causal].abs().max() / (2 ** (bits - 1) - 1)
            s = torch.round(s / scale) * scale
            probs = s.masked_fill(~causal, float("-inf")).softmax(-1)
            out[b, j] = probs @ v[b, j // group]
    return out


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("bits", [4, 8])
@torch.no_grad()
def test_quantized_attention_is_the_explicit_formula(kind, bits):
    model = build(kind)
    x = tokens()
    rope = model.rope(T, x.device)
    attention, h = module_inputs(model, x)[1]
    inputs = attention.project(h, rope)
    with tapped(model, bits=bits):
        if kind == "diff_v1":
            q1, k1, q2, k2, v = inputs
            actual = attention.backend.diff_attend(q1, k1, q2, k2, v, attention.lambda_full(), scale=16**-0.5)
            lam = attention.lambda_full()
            expected = own_quantized_attention(q1, k1, v, bits) - lam * own_quantized_attention(q2, k2, v, bits)
        else:
            q, k, v = inputs[:3]
            actual = attention.backend.attend(q, k, v, scale=16**-0.5)
            expected = own_quantized_attention(q, k, v, bits)
    assert actual.shape == expected.shape
    assert torch.allclose(actual, expected, rtol=1e-4, atol=1e-5)
    # ... and it is not the unquantized attention.
    unquantized = attention.backend.attend(*inputs[:3], scale=16**-0.5) if kind != "diff_v1" else None
    if unquantized is not None:
        assert not torch.allclose(actual, unquantized, atol=1e-6)


@pytest.mark.parametrize("kind", list(KINDS))
@torch.no_grad()
def test_many_bits_approach_the_model(kind):
    model = build(kind)
    x = tokens()
    plain = model(x)
    with tapped(model, bits=15):
        fine = model(x)
    with tapped(model, bits=4):
        coarse = model(x)
    fine_err, coarse_err = (fine - plain).abs().max(), (coarse - plain).abs().max()
    assert fine_err < 1e-3 * plain.abs().max() and fine_err < coarse_err


def test_replacement_note():
    model = build("transformer")
    assert replacement_note(model, [16]) is None
    note = replacement_note(model, [16, 8, 4])
    assert note is not None and "bits 8, 4" in note and repr(model.cfg.attention.backend.value) in note
