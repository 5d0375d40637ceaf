"""What ``diffsweep model info`` / ``compare`` report: sizes, FLOPs and shapes of a config.

Pure Python (no torch): everything comes from ``counting``.
"""

from __future__ import annotations

from typing import Any

from diffsweep.config import SIZES, ResolvedConfig, config_from_dict
from diffsweep.config.enums import TRANSFORMER
from diffsweep.config.kinds import kind_spec
from diffsweep.model import counting


def head_layout(cfg: ResolvedConfig) -> dict[str, Any]:
    """Head geometry as the kernels see it, plus each attention weight's shape."""
    a = cfg.model.attention
    spec = kind_spec(a.kind)
    weights = spec.attention_params(a, cfg.model.d_model)
    return {
        "heads": a.num_heads,
        "kv_heads": a.num_kv_heads,
        "query_heads": spec.query_heads_per_head * a.num_heads,  # sub-heads for diff_v1 (Q1, Q2)
        "key_heads": spec.key_heads_per_kv_head * a.num_kv_heads,  # sub-heads for diff_v1 (K1, K2)
        "qk_dim": a.head_dim,
        "v_dim": spec.v_width * a.head_dim,
        "gqa_group_size": a.kv_group_size,
        "head_norm": a.head_norm.value,
        "weights": {name: list(p.shape) for name, p in weights.items()},
    }


_SHAPE_KEYS = ("vocab_size", "d_model", "n_layers", "ffn_hidden", "tie_embeddings")
_HEAD_KEYS = ("head_dim", "num_heads", "num_kv_heads")


def preset_overrides(cfg: ResolvedConfig) -> list[str]:
    """Shape fields of ``cfg.model`` that differ from its size preset (so its label is not the whole story)."""
    m = cfg.model
    if m.size is None:
        return []
    preset = config_from_dict({"model": {"size": m.size, "attention": {"kind": m.attention.kind}}}).model
    changed = [f"model.{k}" for k in _SHAPE_KEYS if getattr(m, k) != getattr(preset, k)]
    return changed + [f"model.attention.{k}" for k in _HEAD_KEYS
                      if getattr(m.attention, k) != getattr(preset.attention, k)]


def describe(cfg: ResolvedConfig) -> dict[str, Any]:
    """Parameters (total, non-embedding, attention), FLOPs per token and shapes of one config."""
    m, seq_len = cfg.model, cfg.train.seq_len
    a = m.attention
    info: dict[str, Any] = {
        "size": m.size,
        "overrides_of_size": preset_overrides(cfg),
        "arch": a.kind,
        "params": counting.num_params(m),
        "non_embedding_params": counting.num_non_embedding_params(m),
        "embedding_params": counting.num_embedding_params(m),
        "attention_params": counting.num_attention_params(m),
        "seq_len": seq_len,
        "forward_flops_per_token": counting.forward_flops_per_token(m, seq_len),
        "train_flops_per_token": counting.train_flops_per_token(m, seq_len),
        "model": {
            "d_model": m.d_model,
            "n_layers": m.n_layers,
            "ffn_hidden": m.ffn_hidden,
            "vocab_size": m.vocab_size,
            "tie_embeddings": m.tie_embeddings,
        },
        "attention": head_layout(cfg),
    }
    extra = dict(kind_spec(a.kind).summary(a, m.n_layers))  # the kind's own fields (λ_init, pairing, ...)
    info["attention"].update(extra.pop("attention", {}))
    info.update(extra)
    return info


def compare(configs: dict[str, ResolvedConfig], baseline: str = TRANSFORMER) -> dict[str, Any]:
    """``describe`` each config and the mismatch of params and FLOPs against ``baseline`` in percent."""
    rows = {name: describe(cfg) for name, cfg in configs.items()}
    base = rows[baseline]
    for name, row in rows.items():
        for key in ("params", "non_embedding_params", "train_flops_per_token"):
            row[f"{key}_vs_baseline_pct"] = 100.0 * (row[key] - base[key]) / base[key]
        row["parity_ffn_hidden"] = parity_ffn_hidden(configs[name], base["params"])
    return {"baseline": baseline, "rows": rows}


def parity_ffn_hidden(cfg: ResolvedConfig, target_params: int) -> int:
    """The SwiGLU hidden size that brings ``cfg``'s parameter count closest to ``target_params``.

    DIFF V2 adds a second set of query heads and the λ projection; the V2 blog pays for them with
    parameters "borrowed from other parts of the model". Shrinking the FFN is the simplest such
    reallocation: ``--set model.ffn_hidden=<this>`` gives a parameter-matched comparison.
    """
    m = cfg.model
    per_unit = 3 * m.d_model * m.n_layers  # parameters per unit of FFN hidden size
    return m.ffn_hidden + round((target_params - counting.num_params(m)) / per_unit)


def size_table() -> list[dict[str, Any]]:
    """One row per size preset: its shape, sequence length and the Transformer's parameter count."""
    rows = []
    for name in SIZES:
        m = config_from_dict({"model": {"size": name}})
        rows.append({
            "size": name, "d_model": m.model.d_model, "n_layers": m.model.n_layers,
            "head_dim": m.model.attention.head_dim, "ffn_hidden": m.model.ffn_hidden,
            "vocab_size": m.model.vocab_size, "seq_len": m.train.seq_len,
            "transformer_params": counting.num_params(m.model),
        })
    return rows
