"""The paper's attention kinds: one ``KindSpec`` each (registered by name in
``diffsweep.config.kinds.BUILTIN``).

Adding a kind to diffsweep: one class here, its name in ``kinds.BUILTIN``, and its module under
``diffsweep/model/attention/`` (see docs/extending.md).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import ClassVar

from diffsweep.config.enums import HeadNorm, V2Lambda, V2Pairing
from diffsweep.config.errors import ConfigWarning
from diffsweep.config.kind_spec import KindSpec, NameToken, ParamInfo
from diffsweep.config.lambda_init import LambdaInit

FP32 = 4  # bytes; log-sum-exps, RMSNorm statistics and λ are kept in fp32 in both precisions


class Transformer(KindSpec):
    """LLaMA-style softmax attention (MHA/GQA): h heads of dim d on h_kv K/V heads."""

    name = "transformer"
    display_name = "Transformer"
    color = "#1f77b4"
    description = "LLaMA-style softmax attention (MHA/GQA)"
    module = "diffsweep.model.attention.standard:StandardAttention"
    head_norms = (HeadNorm.NONE, HeadNorm.RMSNORM)  # rmsnorm: Table 6 "+GroupNorm" (an explicit runs entry)

    def attention_params(self, a, d_model):
        h, hkv, d = a.num_heads, a.num_kv_heads, a.head_dim
        params = {
            "wq.weight": ParamInfo((h * d, d_model), True),
            "wk.weight": ParamInfo((hkv * d, d_model), True),
            "wv.weight": ParamInfo((hkv * d, d_model), True),
            "wo.weight": ParamInfo((d_model, h * d), True),
        }
        if a.head_norm is HeadNorm.RMSNORM:
            params["head_norm.weight"] = ParamInfo((d,))
        return params

    def attention_flops(self, a, seq_len):
        h, d = a.num_heads, a.head_dim
        return 2 * seq_len * h * d + 2 * seq_len * h * d  # QK^T + AV

    def saved_bytes(self, a, c):
        h, hkv, d = a.num_heads, a.num_kv_heads, a.head_dim
        saved = c * (h * d + 2 * hkv * d + h * d) + FP32 * h  # q, k, v, output; lse
        if a.head_norm is HeadNorm.RMSNORM:
            saved += (FP32 if c == FP32 else 2 * FP32) * h * d + FP32 * h  # + its rstd per head
        return saved


class DiffV1(KindSpec):
    """Differential attention V1 (paper eq. 1-3): h = d_model / 2d heads, Q1/Q2 and K1/K2 of d, V of 2d."""

    name = "diff_v1"
    display_name = "DIFF V1"
    color = "#d62728"
    description = "Differential attention V1 (paper eq. 1-3)"
    module = "diffsweep.model.attention.diff_v1:DiffAttentionV1"
    v_width, query_heads_per_head, key_heads_per_kv_head = 2, 2, 2
    default_head_norm = HeadNorm.RMSNORM
    head_norms = (HeadNorm.RMSNORM, HeadNorm.NONE)
    switches = ("lambda_init",)
    sweep_axes = frozenset({"model.attention.lambda_init", "model.attention.head_norm"})
    name_tokens: ClassVar[Mapping[str, NameToken]] = {
        "model.attention.lambda_init": NameToken("lam", {"exp_decay": "exp"}, drop_prefix="constant:"),
        "model.attention.head_norm": NameToken("gn", {"rmsnorm": "on", "none": "off"}),
    }
    differential = True
    probes = ("lambda",)  # λ per layer (one scalar, paper eq. 2)

    def attention_params(self, a, d_model):
        h, hkv, d = a.num_heads, a.num_kv_heads, a.head_dim
        params = {
            "wq.weight": ParamInfo((2 * h * d, d_model), True),
            "wk.weight": ParamInfo((2 * hkv * d, d_model), True),
            "wv.weight": ParamInfo((hkv * 2 * d, d_model), True),
            "wo.weight": ParamInfo((d_model, h * 2 * d), True),
            "lambda_q1": ParamInfo((d,)),
            "lambda_k1": ParamInfo((d,)),
            "lambda_q2": ParamInfo((d,)),
            "lambda_k2": ParamInfo((d,)),
        }
        if a.head_norm is HeadNorm.RMSNORM:
            params["head_norm.weight"] = ParamInfo((2 * d,))
        return params

    def attention_flops(self, a, seq_len):
        h, d = a.num_heads, a.head_dim
        return 2 * (2 * seq_len * h * d) + 2 * (2 * seq_len * h * 2 * d)  # two maps; each A_i V with V of 2d

    def saved_bytes(self, a, c):
        h, hkv, d = a.num_heads, a.num_kv_heads, a.head_dim
        saved = c * (2 * h * d + 4 * hkv * d) + c * 2 * (h * 2 * d) + FP32 * 4 * h  # q, k, v; two maps' outputs, lse
        saved += FP32 * h * 2 * d  # the second map's output, kept for dλ
        if a.head_norm is HeadNorm.RMSNORM:
            saved += 2 * FP32 * h * 2 * d + FP32 * h  # + its rstd per head
        return saved

    def summary(self, a, n_layers):
        scaled = a.head_norm is HeadNorm.RMSNORM
        return {
            "lambda_init": {"strategy": a.lambda_init, "per_layer": LambdaInit.parse(a.lambda_init).schedule(n_layers)},
            "attention": {"output_scale": "(1 - lambda_init) after per-head RMSNorm" if scaled else "none"},
        }


class DiffV2(KindSpec):
    """Differential attention V2 (V2 blog): 2h query heads of d on h_kv K/V heads, no per-head norm."""

    name = "diff_v2"
    display_name = "DIFF V2"
    color = "#2ca02c"
    description = "Differential attention V2 (V2 blog)"
    module = "diffsweep.model.attention.diff_v2:DiffAttentionV2"
    query_heads_per_head = 2
    switches = ("v2_pairing", "v2_lambda")
    sweep_axes = frozenset({"model.attention.v2_pairing", "model.attention.v2_lambda"})
    name_tokens: ClassVar[Mapping[str, NameToken]] = {
        "model.attention.v2_pairing": NameToken("pair", {"same_group": "same", "cross_group": "cross"}),
        "model.attention.v2_lambda": NameToken("vlam"),
    }
    probes = ("lambda",)  # λ per token and head: its mean and spread per layer

    def attention_params(self, a, d_model):
        h, hkv, d = a.num_heads, a.num_kv_heads, a.head_dim
        params = {
            "wq.weight": ParamInfo((2 * h * d, d_model), True),
            "wk.weight": ParamInfo((hkv * d, d_model), True),
            "wv.weight": ParamInfo((hkv * d, d_model), True),
            "wo.weight": ParamInfo((d_model, h * d), True),
        }
        if a.v2_lambda is not V2Lambda.NONE:
            params["wlambda.weight"] = ParamInfo((h, d_model), True)
        return params

    def attention_flops(self, a, seq_len):
        h, d = a.num_heads, a.head_dim
        return 2 * seq_len * 2 * h * d + 2 * seq_len * 2 * h * d  # one call over 2h query heads

    def saved_bytes(self, a, c):
        h, hkv, d = a.num_heads, a.num_kv_heads, a.head_dim
        saved = c * (2 * h * d + 2 * hkv * d + 2 * h * d) + FP32 * 2 * h
        if a.v2_lambda is not V2Lambda.NONE:
            saved += (FP32 + c) * h
        return saved

    def input_readers(self, a):
        return 3 + (a.v2_lambda is not V2Lambda.NONE)  # + wλ

    def check(self, a, key):
        if a.v2_pairing is V2Pairing.CROSS_GROUP and a.num_kv_heads == 1:
            warnings.warn(
                f"{key}.v2_pairing: cross_group with one K/V head pairs heads of the same (only) GQA "
                "group, so it is not the blog's cross-group ablation",
                ConfigWarning,
                stacklevel=4,
            )

    def summary(self, a, n_layers):
        return {"attention": {"pairing": a.v2_pairing.value, "lambda": a.v2_lambda.value}}
