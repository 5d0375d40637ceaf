"""Every closed choice in a config is a StrEnum; the attention kind, an open one, is a name. Implementations
are looked up in one registry per choice (in the layer that implements them), never by scattered
``if`` chains."""

from __future__ import annotations

from enum import StrEnum
from typing import TypeAlias

# The attention kind is the one open choice: a name that ``diffsweep.config.kinds`` checks against
# its registry when a config is read (the paper's three below, and any a package adds).
AttentionKind: TypeAlias = str
TRANSFORMER: AttentionKind = "transformer"  # LLaMA-style softmax attention (MHA/GQA), the baseline
DIFF_V1: AttentionKind = "diff_v1"  # Differential Transformer, paper eq. 1-3
DIFF_V2: AttentionKind = "diff_v2"  # Differential Transformer V2 (blog): 2h query heads, per-token lambda


class LambdaInitStrategy(StrEnum):
    """How DIFF V1's lambda_init depends on depth (paper §2.1, Table 6)."""

    EXP_DECAY = "exp_decay"  # 0.8 - 0.6 * exp(-0.3 * (l - 1)), l = 1..L
    CONSTANT = "constant"  # written ``constant:<value>``, value in (0, 1)


class HeadNorm(StrEnum):
    """Per-head normalization of the attention output (the paper's "GroupNorm")."""

    RMSNORM = "rmsnorm"
    NONE = "none"


class Backend(StrEnum):
    """Which kernel computes attention. Independent of the attention kind."""

    REFERENCE = "reference"  # explicit softmax(QK^T)V in PyTorch; ground truth
    SDPA = "sdpa"  # torch.nn.functional.scaled_dot_product_attention; always available
    FLASH = "flash"  # flash-attn package, CUDA only
    TRITON = "triton"  # fused Triton kernels from diffsweep_kernels, CUDA only


class V2Pairing(StrEnum):
    """Which two query heads DIFF V2 subtracts (V2 blog, design ablation 1)."""

    SAME_GROUP = "same_group"  # heads 2i and 2i+1: same GQA group, shared K and V (V2)
    CROSS_GROUP = "cross_group"  # heads i and i+h: different GQA groups (ablation, unstable)


class V2Lambda(StrEnum):
    """How DIFF V2 turns the projected lambda into the subtraction weight (blog ablations 2, 3)."""

    SIGMOID = "sigmoid"  # attn1 - sigmoid(x W_lambda) * attn2 (V2)
    NONE = "none"  # attn1 - attn2, no lambda projection at all (ablation 2)
    RAW = "raw"  # attn1 - (x W_lambda) * attn2, no sigmoid (ablation 3)


class LRSchedule(StrEnum):
    """Learning-rate schedule after linear warmup."""

    LINEAR = "linear"  # linear decay to min_lr (paper)
    COSINE = "cosine"
    WSD = "wsd"  # warmup-stable-decay: constant, then a linear cooldown over the last decay_fraction
    WSD_SQRT = "wsd_sqrt"  # the same with a 1 - sqrt cooldown (Hägele et al. 2024)
    WSD_COSINE = "wsd_cosine"  # the same with a cosine cooldown

    @property
    def is_wsd(self) -> bool:
        """Warmup-stable-decay: the learning rate until the cooldown does not depend on the run's length."""
        return self in WSD_SCHEDULES


WSD_SCHEDULES = frozenset({LRSchedule.WSD, LRSchedule.WSD_SQRT, LRSchedule.WSD_COSINE})


class Precision(StrEnum):
    """Numeric precision of training."""

    AUTO = "auto"  # bf16 autocast on GPU, fp32 on CPU
    FP32 = "fp32"
    BF16 = "bf16"  # bf16 autocast, fp32 master weights


class Compile(StrEnum):
    """Whether training runs each block through ``torch.compile`` (YAML's true/false are read as these)."""

    AUTO = "auto"  # on where training uses CUDA (and a backend it is checked with), off on the CPU
    TRUE = "true"
    FALSE = "false"


# The attention backends checked under torch.compile (tests/model/test_compile_on_cpu.py); flash and
# triton are not yet (they need a GPU): train.compile auto trains them eagerly, true refuses them.
COMPILED_BACKENDS = frozenset({Backend.REFERENCE, Backend.SDPA})


def compiles(setting: Compile, backend: Backend, *, cuda: bool) -> bool:
    """Whether training compiles its blocks: ``true`` always (``diffsweep.model.compile`` refuses a
    backend outside ``COMPILED_BACKENDS``), ``auto`` on CUDA with a backend in it, ``false`` never."""
    if setting is Compile.TRUE:
        return True
    return setting is Compile.AUTO and cuda and backend in COMPILED_BACKENDS


class Parallel(StrEnum):
    """How training spreads over several processes (used only when there is more than one)."""

    DDP = "ddp"  # DistributedDataParallel: a full replica per GPU, gradients all-reduced
    FSDP = "fsdp"  # FSDP2 (fully_shard per block): parameters, gradients and optimizer state sharded


class TokenizerKind(StrEnum):
    """Tokenizer of a dataset; part of a run's identity."""

    CL100K_BASE = "cl100k_base"  # the paper's tokenizer (offline copy)
    BPE = "bpe"  # byte-level BPE trained offline on the corpus (small vocab for tiny models)
    BYTES = "bytes"  # raw UTF-8 bytes, vocab 256
