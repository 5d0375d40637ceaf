"""The toy kind's definition (no torch here: diffsweep reads it for ``--help``, sweeps and counts)."""

from __future__ import annotations

from diffsweep.config.kinds import KindSpec, ParamInfo


class ToyKind(KindSpec):
    """Softmax attention (MHA/GQA) whose output is scaled by one learned scalar per layer, the gate."""

    name = "toy"
    display_name = "Toy gate"
    color = "#9467bd"
    description = "softmax attention with a learned output gate per layer"
    module = "toy_kind.module:GatedAttention"
    probes = ("gate",)

    def attention_params(self, a, d_model):
        h, hkv, d = a.num_heads, a.num_kv_heads, a.head_dim
        return {
            "wq.weight": ParamInfo((h * d, d_model), True),
            "wk.weight": ParamInfo((hkv * d, d_model), True),
            "wv.weight": ParamInfo((hkv * d, d_model), True),
            "wo.weight": ParamInfo((d_model, h * d), True),
            "gate": ParamInfo((1,)),
        }

    def attention_flops(self, a, seq_len):
        return 4 * seq_len * a.num_heads * a.head_dim  # QK^T + AV

    def saved_bytes(self, a, c):
        h, hkv, d = a.num_heads, a.num_kv_heads, a.head_dim
        return c * (2 * h * d + 2 * hkv * d + h * d) + 4 * h  # q, k, v, output, gated output; lse
