"""Typed, keyword-only, frozen configs. YAML is only their serialization (see ``loading``).

A declared config (``Config``: what a file says) may leave derived fields ``None``; ``resolve``
fills them in and returns a resolved config (``ResolvedConfig``, whose ``model`` and
``model.attention`` are ``ResolvedModel`` and ``ResolvedAttention``: the same fields, the derived
ones no longer Optional). ``load_config`` always returns a resolved config; the model, memory and
benchmark code take the resolved types, so the type checker sees that they never meet ``None``.
A resolved config is a declared one too (a subclass), with the same fields and run key.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from diffsweep.config.enums import (
    TRANSFORMER,
    AttentionKind,
    Backend,
    Compile,
    HeadNorm,
    LRSchedule,
    Parallel,
    Precision,
    TokenizerKind,
    V2Lambda,
    V2Pairing,
)
from diffsweep.config.errors import ConfigError
from diffsweep.config.lambda_init import LambdaInit


@dataclass(frozen=True, kw_only=True)
class AttentionConfig:
    """What attention computes (``kind`` and its switches) and which kernel runs it (``backend``).

    Head geometry, with d = ``head_dim`` (the baseline Transformer's head dimension):

    - ``transformer``: ``num_heads`` heads of dim d (default d_model / d), ``num_kv_heads`` K/V heads.
    - ``diff_v1``: ``num_heads`` differential heads (default d_model / 2d, half the baseline's),
      each with Q1, Q2 of dim d and a V of dim 2d; ``num_kv_heads`` KV groups, each with its own
      K1, K2 (dim d) and one V (dim 2d). Projections keep the baseline's size (paper §2.1).
    - ``diff_v2``: ``num_heads`` output heads (default d_model / d, the baseline's), computed from
      2 * ``num_heads`` query heads of dim d on ``num_kv_heads`` K/V heads of dim d (V2 blog).

    GQA: ``kv_group_size`` (heads per K/V head or group, default 1 = no GQA) means the same for
    every kind and keeps the kinds parameter-matched (diff_v1 at group size g has half the
    baseline's KV groups, each twice as wide), so sweep over it rather than ``num_kv_heads``.
    ``num_kv_heads`` pins the count directly (as in the official code) and must agree with it.
    """

    # Any registered kind: the paper's three or a plug-in's (``diffsweep.config.kinds``).
    kind: AttentionKind = TRANSFORMER
    backend: Backend = Backend.SDPA
    head_dim: int = 128
    num_heads: int | None = None  # None: derived from d_model and head_dim per kind (above)
    num_kv_heads: int | None = None  # None: num_heads / kv_group_size
    kv_group_size: int | None = None  # None: num_heads / num_kv_heads, or 1 (no GQA) if neither is set
    head_norm: HeadNorm | None = None  # None: rmsnorm for diff_v1, none otherwise
    lambda_init: str = "exp_decay"  # diff_v1 only: "exp_decay" or "constant:<value in (0,1)>"
    v2_pairing: V2Pairing = V2Pairing.SAME_GROUP  # diff_v2 only
    v2_lambda: V2Lambda = V2Lambda.SIGMOID  # diff_v2 only

    @property
    def parsed_lambda_init(self) -> LambdaInit:
        """``lambda_init`` as a typed value (parsed once per spelling; validated by ``resolve``)."""
        return LambdaInit.parse(self.lambda_init)


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """A LLaMA-style decoder: pre-norm RMSNorm, SwiGLU, RoPE, no biases."""

    size: str | None = None  # preset name (see ``diffsweep model sizes``); a label once loaded
    vocab_size: int = 100_288
    d_model: int = 2048
    n_layers: int = 24
    # SwiGLU hidden size. None: 8 * d_model / 3 (paper App. C: "FFN size is 8/3 d_model") rounded
    # up to a multiple of 8, which GPU GEMMs need to run fast (default_ffn_hidden); every Table 9
    # size stays within 1% of its label; 3072 -> 8192 as in Table 8.
    ffn_hidden: int | None = None
    tie_embeddings: bool = True  # Table 9's counts need tied input/output embeddings
    rope_theta: float = 10_000.0
    norm_eps: float = 1e-5
    init_std: float = 0.02
    attention: AttentionConfig = field(default_factory=AttentionConfig)


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """The optimisation recipe. Defaults are the paper's 1.4B recipe (App. C)."""

    seed: int = 0
    seq_len: int = 2048
    batch_tokens: int = 262_144  # global batch in tokens; a multiple of seq_len
    micro_batch_size: int = 1  # sequences per forward pass; accumulation fills batch_tokens
    max_steps: int | None = 40_000  # the budget: max_steps or max_tokens (exactly one set)
    max_tokens: int | None = None
    lr: float = 1.5e-4
    min_lr: float = 0.0
    betas: tuple[float, float] = (0.9, 0.98)
    eps: float = 1e-8
    weight_decay: float = 0.05
    warmup_steps: int = 375
    schedule: LRSchedule = LRSchedule.LINEAR
    decay_fraction: float = 0.2  # wsd schedules only: share of steps spent decaying (the cooldown)
    grad_clip: float = 1.0
    precision: Precision = Precision.AUTO
    # torch.compile, one block compiled and reused by every layer (diffsweep.model.compile):
    # auto = on where CUDA trains; evaluation and probes run the same blocks eagerly.
    compile: Compile = Compile.AUTO
    # Several processes (torchrun, or one Slurm task per GPU): how the model is spread over them,
    # and whether blocks recompute their activations in the backward. Neither changes the math.
    parallel: Parallel = Parallel.FSDP
    activation_checkpointing: bool = False
    eval_every: int = 1000  # steps between validation + probes (λ, outliers, AR-Hit slices)
    eval_tokens: int = 4_194_304  # validation tokens per evaluation (whole sequences)
    log_every: int = 10  # steps between console lines (MLflow gets every step, batched)
    checkpoint_every: int = 1000
    keep_checkpoints: int = 3  # newest k checkpoints kept; older ones are deleted
    # Steps also checkpointed, and never deleted: a sweep's cooldown branches start from them.
    checkpoint_at: tuple[int, ...] = ()
    # A loss spike: a step whose train loss exceeds the mean of the previous 100 steps by more
    # than this many of their standard deviations (counted, logged; the run goes on).
    spike_threshold: float = 6.0

    @property
    def total_steps(self) -> int:
        """Steps in the run: ``max_steps``, or ``max_tokens`` rounded up to whole batches."""
        if self.max_steps is not None:
            return self.max_steps
        if self.max_tokens is None:  # validation refuses a config with neither
            raise ConfigError("train.max_steps", "set exactly one of train.max_steps and train.max_tokens (got neither)")
        return -(-self.max_tokens // self.batch_tokens)

    @property
    def decay_start(self) -> int:
        """The last step at the peak learning rate: the end of warmup, or with a wsd schedule the
        end of the stable phase (the cooldown is the last ``decay_fraction`` of the steps, at
        least one)."""
        n = self.total_steps
        if not self.schedule.is_wsd:
            return self.warmup_steps
        return max(self.warmup_steps, n - max(1, round(self.decay_fraction * n)))


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    """Where the token dataset lives and how it was tokenized."""

    path: str = "data/demo"  # directory made by ``diffsweep data prepare``
    tokenizer: TokenizerKind = TokenizerKind.BPE


@dataclass(frozen=True, kw_only=True)
class Config:
    """One training run."""

    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    data: DataConfig = field(default_factory=DataConfig)


# -- resolved configs (``diffsweep.config.validate.resolve``) -------------------------------------


@dataclass(frozen=True, kw_only=True)
class ResolvedAttention(AttentionConfig):
    """An ``AttentionConfig`` with its head geometry and per-head norm derived."""

    # ``field()``: no default (a bare annotation would inherit the declared class's None)
    num_heads: int = field()
    num_kv_heads: int = field()
    kv_group_size: int = field()
    head_norm: HeadNorm = field()


@dataclass(frozen=True, kw_only=True)
class ResolvedModel(ModelConfig):
    """A ``ModelConfig`` with its FFN size and attention derived."""

    ffn_hidden: int = field()
    attention: ResolvedAttention = field()


@dataclass(frozen=True, kw_only=True)
class ResolvedConfig(Config):
    """A ``Config`` as ``resolve`` returns it: checked, every derived field filled in."""

    model: ResolvedModel = field()
