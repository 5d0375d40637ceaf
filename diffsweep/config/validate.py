"""Semantic validation and derivation of a decoded config (pure Python, no torch).

``resolve`` fills every derived field (head counts, per-head norm, FFN size), checks the
relations between fields and that sizes are within bounds (before anything is derived from
them), and warns (``ConfigWarning``) about settings that have no effect.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings

from diffsweep.config.enums import AttentionKind
from diffsweep.config.errors import ConfigError, ConfigWarning
from diffsweep.config.kinds import kind_spec, kind_specs
from diffsweep.config.lambda_init import LambdaInit
from diffsweep.config.schema import (
    AttentionConfig,
    Config,
    ModelConfig,
    ResolvedAttention,
    ResolvedConfig,
    ResolvedModel,
    TrainConfig,
)
from diffsweep.config.units import human

__all__ = ["default_ffn_hidden", "estimated_params", "resolve"]


FFN_MULTIPLE = 8  # bf16 elements in 16 bytes, the alignment cuBLAS's fast GEMM kernels need


def default_ffn_hidden(d_model: int) -> int:
    """SwiGLU hidden size: 8 * d_model / 3 (paper App. C), rounded up to a multiple of 8.

    Measured on an H100 (analysis/benchmarks/RESULTS.md): at 1.4B, floor(8 * 2048 / 3) = 5461 made
    the FFN's bf16 GEMMs run at 135-144 TFLOP/s against 688-775 at 5464 or 5632, and a whole
    training step take 1.9x as long. Rounding adds at most 0.06% to a Table 9 size's count."""
    return -(-(8 * d_model // 3) // FFN_MULTIPLE) * FFN_MULTIPLE


def resolve(config: Config) -> ResolvedConfig:
    """Validate ``config`` and return it with every derived field filled in."""
    model, caught = _resolve_model_once(config.model)
    for message, category in caught:  # replayed on every call, cached or not
        warnings.warn(message, category, stacklevel=2)
    _check_train(config.train)
    return ResolvedConfig(model=model, train=config.train, data=config.data)


def _fields(obj: object) -> dict[str, object]:
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}  # type: ignore[arg-type]


@functools.lru_cache(maxsize=1024)  # model configs are frozen; a sweep resolves the same ones often
def _resolve_model_once(m: ModelConfig) -> tuple[ResolvedModel, tuple[tuple[str, type[Warning]], ...]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = _resolve_model(m)
    return model, tuple((str(w.message), w.category) for w in caught)


def _positive(value: int | float, key: str) -> None:
    if not value > 0:
        raise ConfigError(key, f"expected a positive number, got {value!r}")


# Bounds on model sizes, checked before anything is derived, counted or allocated. They lie far
# above any model trained to date (the largest published dense models have d_model ~ 2.5e4,
# ~1.3e2 layers, FFNs ~ 1e5 wide, vocabularies ~ 2.6e5 and ~ 1e12 parameters), so only a slip
# such as a value in bytes or an extra digit group reaches them.
MAX_PARAMS = 10**13
MAX_MODEL_DIMS = {
    "model.vocab_size": 2**24,
    "model.d_model": 2**18,
    "model.n_layers": 2**14,
    "model.ffn_hidden": 2**20,
    "model.attention.head_dim": 2**16,
    "model.attention.num_heads": 2**16,
    "model.attention.num_kv_heads": 2**16,
    "model.attention.kv_group_size": 2**16,
}
# Token counts that size what the trainer allocates: the RoPE table and every activation (a
# sequence, a micro-batch), the start offsets drawn for each step (a batch). Published runs use
# sequences of 2^11-2^20 tokens and batches of at most ~2^26.
MAX_SEQ_LEN = 2**24
MAX_MICRO_BATCH_TOKENS = 2**24
MAX_BATCH_TOKENS = 2**32
MAX_INT = 2**63 - 1  # every integer setting must fit in int64 (tensors, numpy, checkpoints)


def estimated_params(m: ModelConfig) -> int:
    """Parameters of ``m``'s embeddings and matmul weights, from its dimensions alone.

    Norm weights and the λ vectors are left out (under 0.5% of any preset; a test checks it
    against ``diffsweep.model.counting``, which ``config`` cannot import). Works on a declared
    config too: unset head counts are the parameter-matched defaults.
    """
    a = m.attention
    spec = kind_spec(a.kind)
    heads = a.num_heads if a.num_heads is not None else m.d_model // max(1, spec.v_width * a.head_dim)
    kv_heads = a.num_kv_heads if a.num_kv_heads is not None else heads // max(1, a.kv_group_size or 1)
    attention = a.head_dim * (spec.query_heads_per_head * heads + spec.key_heads_per_kv_head * kv_heads
                              + spec.v_width * kv_heads + spec.v_width * heads)  # wq, wk, wv, wo per d_model
    ffn = m.ffn_hidden if m.ffn_hidden is not None else default_ffn_hidden(m.d_model)
    per_layer = m.d_model * (attention + 3 * ffn)  # SwiGLU: gate, up, down
    return m.n_layers * per_layer + m.vocab_size * m.d_model * (1 if m.tie_embeddings else 2)


def _describe_params(n: int) -> str:
    return f"a model of about {_amount(n, ' parameters')}, {_amount(4 * n, ' bytes')} of fp32 weights"


def _amount(n: int, unit: str) -> str:
    """``human(n)`` (K to E) with its unit, or scientific notation past E."""
    return f"{human(n)}{unit}" if n < 10**21 else f"{n:.3g} {unit.strip()}"


def _check_model_size(m: ModelConfig) -> None:
    """Refuse absurd dimensions, naming the key, before anything derives or allocates from them."""
    a = m.attention
    values = {"model.vocab_size": m.vocab_size, "model.d_model": m.d_model, "model.n_layers": m.n_layers,
              "model.ffn_hidden": m.ffn_hidden, "model.attention.head_dim": a.head_dim,
              "model.attention.num_heads": a.num_heads, "model.attention.num_kv_heads": a.num_kv_heads,
              "model.attention.kv_group_size": a.kv_group_size}
    for key, value in values.items():
        if value is not None and value > MAX_MODEL_DIMS[key]:
            raise ConfigError(key, f"{value} is over the limit of {MAX_MODEL_DIMS[key]:,} "
                              f"({_describe_params(estimated_params(m))}); expected at most {MAX_MODEL_DIMS[key]:,}")
    n = estimated_params(m)
    if n > MAX_PARAMS:
        raise ConfigError("model", f"{_describe_params(n)} is over the limit of {human(MAX_PARAMS)} parameters "
                          f"(d_model {m.d_model}, n_layers {m.n_layers}, vocab_size {m.vocab_size}); expected a "
                          "smaller model")


def _resolve_model(m: ModelConfig) -> ResolvedModel:
    for name in ("vocab_size", "d_model", "n_layers", "rope_theta", "norm_eps", "init_std"):
        _positive(getattr(m, name), f"model.{name}")
    _positive(m.attention.head_dim, "model.attention.head_dim")
    _check_model_size(m)
    ffn = m.ffn_hidden if m.ffn_hidden is not None else default_ffn_hidden(m.d_model)
    _positive(ffn, "model.ffn_hidden")
    attention = _resolve_attention(m.attention, m.d_model)
    model = ResolvedModel(**{**_fields(m), "ffn_hidden": ffn, "attention": attention})  # type: ignore[arg-type]
    _check_model_size(model)  # again with the derived head counts
    return model


def _divisors(n: int) -> str:
    return ", ".join(str(k) for k in range(1, n + 1) if n % k == 0)


def _resolve_attention(a: AttentionConfig, d_model: int) -> ResolvedAttention:
    key = "model.attention"
    spec = kind_spec(a.kind)
    d = a.head_dim
    _positive(d, f"{key}.head_dim")
    if d % 2:
        raise ConfigError(f"{key}.head_dim", f"must be even (RoPE rotates pairs of channels), got {d}")

    # Head count: each head reads v_width * d value channels (diff_v1: 2d, so half the heads).
    width = spec.v_width * d
    what = f"{spec.v_width} * head_dim = {width}" if spec.v_width > 1 else f"head_dim = {d}"
    num_heads = a.num_heads
    if num_heads is None:
        if d_model % width:
            raise ConfigError(
                f"{key}.head_dim",
                f"{what} does not divide model.d_model = {d_model} for {a.kind}; pick a head_dim "
                f"that does or set {key}.num_heads explicitly",
            )
        num_heads = d_model // width
    _positive(num_heads, f"{key}.num_heads")
    if num_heads * width != d_model:
        warnings.warn(
            f"{key}.num_heads: {num_heads} {a.kind} heads x {what} = {num_heads * width} channels != "
            f"model.d_model = {d_model}: attention is not parameter-matched to the baseline "
            f"(leave num_heads unset to derive it per kind)",
            ConfigWarning,
            stacklevel=3,
        )
    num_kv, group = _resolve_gqa(a, num_heads, key)

    # Every switch is parsed whatever the kind (a typo fails even where the switch has no effect);
    # the canonical spelling is what the run key hashes.
    lambda_init = str(LambdaInit.parse(a.lambda_init, f"{key}.lambda_init"))
    head_norm = a.head_norm if a.head_norm is not None else spec.default_head_norm
    if head_norm not in spec.head_norms:
        raise ConfigError(
            f"{key}.head_norm",
            f"{a.kind} allows [{', '.join(n.value for n in spec.head_norms)}], got {head_norm.value!r}",
        )

    defaults = AttentionConfig()
    for name in sorted({s for other in kind_specs().values() for s in other.switches}, key=_SWITCH_ORDER.index):
        if name not in spec.switches and getattr(a, name) != getattr(defaults, name):
            users = [k for k, s in kind_specs().items() if name in s.switches]
            _no_effect(f"{key}.{name}", str(getattr(a, name)), a.kind, ", ".join(users))
    resolved = ResolvedAttention(**{  # type: ignore[arg-type]
        **_fields(a), "num_heads": num_heads, "num_kv_heads": num_kv, "kv_group_size": group, "head_norm": head_norm,
        "lambda_init": lambda_init,
    })
    spec.check(resolved, key)
    return resolved


# Switch fields in schema order (warnings about them come in this order).
_SWITCH_ORDER = [f.name for f in dataclasses.fields(AttentionConfig)]


def _resolve_gqa(a: AttentionConfig, num_heads: int, key: str) -> tuple[int, int]:
    """(num_kv_heads, kv_group_size) from whichever is set; both set must agree."""
    if a.num_kv_heads is not None:
        _positive(a.num_kv_heads, f"{key}.num_kv_heads")
        if num_heads % a.num_kv_heads:
            raise ConfigError(
                f"{key}.num_kv_heads",
                f"{a.num_kv_heads} does not divide num_heads = {num_heads} (GQA groups must be equal); "
                f"expected one of [{_divisors(num_heads)}]",
            )
        group = num_heads // a.num_kv_heads
        if a.kv_group_size is not None and a.kv_group_size != group:
            raise ConfigError(
                f"{key}.kv_group_size",
                f"{a.kv_group_size} disagrees with num_heads / num_kv_heads = {num_heads} / {a.num_kv_heads} "
                f"= {group}; set only one of them",
            )
        return a.num_kv_heads, group
    group = a.kv_group_size if a.kv_group_size is not None else 1
    _positive(group, f"{key}.kv_group_size")
    if num_heads % group:
        raise ConfigError(
            f"{key}.kv_group_size",
            f"{group} does not divide num_heads = {num_heads} ({a.kind}); expected one of [{_divisors(num_heads)}]",
        )
    return num_heads // group, group


def _no_effect(key: str, value: str, kind: AttentionKind, applies_to: str) -> None:
    warnings.warn(
        f"{key}: {value!r} has no effect for attention kind {kind!r} (only {applies_to} uses it)",
        ConfigWarning,
        stacklevel=4,
    )


def _check_train(t: TrainConfig) -> None:
    key = "train"
    if not 0 <= t.seed <= MAX_INT:  # torch.manual_seed and numpy's generators take no negative seed
        raise ConfigError(f"{key}.seed", f"expected an integer in [0, 2**63 - 1], got {t.seed}")
    for name in ("seq_len", "batch_tokens", "micro_batch_size", "eval_every", "eval_tokens", "log_every",
                 "checkpoint_every", "keep_checkpoints", "spike_threshold"):
        _positive(getattr(t, name), f"{key}.{name}")
    for name in ("batch_tokens", "micro_batch_size", "max_steps", "max_tokens", "warmup_steps", "eval_every",
                 "eval_tokens", "log_every", "checkpoint_every", "keep_checkpoints"):
        value = getattr(t, name)
        if value is not None and value > MAX_INT:
            raise ConfigError(f"{key}.{name}", f"{value} does not fit in 64 bits; expected at most 2**63 - 1")
    for name, limit in (("seq_len", MAX_SEQ_LEN), ("batch_tokens", MAX_BATCH_TOKENS)):
        if getattr(t, name) > limit:
            raise ConfigError(f"{key}.{name}", f"{getattr(t, name):,} tokens is over the limit of {limit:,}")
    if t.micro_batch_size * t.seq_len > MAX_MICRO_BATCH_TOKENS:
        raise ConfigError(f"{key}.micro_batch_size", f"{t.micro_batch_size} sequences of {t.seq_len} tokens is over "
                          f"the limit of {MAX_MICRO_BATCH_TOKENS:,} tokens per micro-batch")
    if t.batch_tokens % (t.seq_len * t.micro_batch_size):
        raise ConfigError(
            f"{key}.batch_tokens",
            f"{t.batch_tokens} is not a multiple of seq_len * micro_batch_size = "
            f"{t.seq_len * t.micro_batch_size}",
        )
    if (t.max_steps is None) == (t.max_tokens is None):
        raise ConfigError(f"{key}.max_steps", "set exactly one of train.max_steps and train.max_tokens "
                          f"(got max_steps={t.max_steps}, max_tokens={t.max_tokens})")
    if t.max_steps is not None:
        _positive(t.max_steps, f"{key}.max_steps")
    if t.max_tokens is not None:
        _positive(t.max_tokens, f"{key}.max_tokens")
    _positive(t.lr, f"{key}.lr")
    if not 0.0 <= t.min_lr <= t.lr:
        raise ConfigError(f"{key}.min_lr", f"expected a value in [0, lr = {t.lr}], got {t.min_lr}")
    for i, beta in enumerate(t.betas):
        if not 0.0 <= beta < 1.0:
            raise ConfigError(f"{key}.betas[{i}]", f"expected a value in [0, 1), got {beta}")
    _positive(t.eps, f"{key}.eps")
    for name in ("weight_decay", "warmup_steps", "grad_clip"):
        if getattr(t, name) < 0:
            raise ConfigError(f"{key}.{name}", f"expected a non-negative number, got {getattr(t, name)!r}")
    steps = t.total_steps
    if t.warmup_steps >= steps:
        budget = f"train.max_steps = {t.max_steps}" if t.max_steps is not None else (
            f"the {steps} steps of train.max_tokens = {t.max_tokens}")
        raise ConfigError(f"{key}.warmup_steps", f"{t.warmup_steps} is not below {budget}")
    for i, at in enumerate(t.checkpoint_at):
        if isinstance(at, bool) or not isinstance(at, int) or not 1 <= at <= steps:
            raise ConfigError(f"{key}.checkpoint_at[{i}]", f"expected a step from 1 to the run's {steps}, got {at!r}")
    if not 0.0 < t.decay_fraction <= 1.0:
        raise ConfigError(f"{key}.decay_fraction", f"expected a value in (0, 1], got {t.decay_fraction}")
    if not t.schedule.is_wsd and t.decay_fraction != TrainConfig().decay_fraction:
        warnings.warn(
            f"{key}.decay_fraction: {t.decay_fraction} has no effect with schedule {t.schedule.value!r} "
            "(only wsd uses it)",
            ConfigWarning,
            stacklevel=3,
        )
