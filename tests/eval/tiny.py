"""Tiny random models for the probe tests (no training needed to compare a probe with a direct
computation): each attention kind with GQA where it has it, and an ``EvalContext`` around one."""

from __future__ import annotations

import numpy as np
import torch

from diffsweep.config import load_config
from diffsweep.data.tokenizers import BytesTokenizer
from diffsweep.eval.probe import EvalContext
from diffsweep.model.transformer import build_model

KINDS = {
    "transformer": ["model.attention.kind=transformer", "model.attention.num_kv_heads=2"],
    "diff_v1": ["model.attention.kind=diff_v1", "model.attention.num_kv_heads=1"],
    "diff_v2": ["model.attention.kind=diff_v2", "model.attention.num_kv_heads=2"],
}


def tiny_context(kind: str, tmp_path, *, seq: int, tokens: int, qk_std: float | None = None) -> EvalContext:
    """A tiny-xs model of ``kind`` (vocabulary 64, ``seq`` tokens) at its seed-0 initialisation, on
    ``tokens`` random validation tokens; ``qk_std``: Q/K weights drawn wider than the init, so that
    attention is far from uniform."""
    config = load_config(None, ["model.size=tiny-xs", "model.vocab_size=64", f"train.seq_len={seq}", *KINDS[kind]])
    torch.manual_seed(0)
    model = build_model(config.model).eval()
    if qk_std is not None:
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith(("wq.weight", "wk.weight")):
                    p.normal_(0, qk_std)
    val = np.random.default_rng(0).integers(0, 64, size=tokens).astype(np.uint16)
    return EvalContext(model=model, config=config, tokenizer=BytesTokenizer(), val_tokens=val,
                       device=torch.device("cpu"), autocast_dtype=None, out_dir=tmp_path)
