"""Every closed choice in a config is a StrEnum. Implementations are looked up in one registry
per enum (in the layer that implements them), never by scattered ``if`` chains."""

from __future__ import annotations

from enum import EnumType, StrEnum
from typing import Any

_KINDS_READY = False  # set once AttentionKind exists; before that its metaclass loads nothing


class _OpenKindType(EnumType):
    """The metaclass of ``AttentionKind``: listing or looking up kinds first registers every kind.

    Kinds are defined in ``diffsweep.config.kinds`` (the built-in ones) and in the user's own
    packages (entry points, group ``diffsweep.attention_kinds``); registering them is deferred to
    the first question about the set of kinds, so importing ``diffsweep.config`` stays cheap and a
    plug-in may import ``diffsweep.config`` itself.
    """

    def __iter__(cls):
        _register_kinds()
        return super().__iter__()

    def __len__(cls) -> int:
        _register_kinds()
        return super().__len__()

    def __contains__(cls, value: object) -> bool:
        _register_kinds()
        try:
            return isinstance(value, cls) or value in cls._value2member_map_
        except TypeError:  # an unhashable value (a YAML list) is no kind
            return False

    def __call__(cls, value: Any, *args: Any, **kwargs: Any):
        if not args and not kwargs:  # a lookup, not the functional API
            _register_kinds()
        return super().__call__(value, *args, **kwargs)


def _register_kinds() -> None:
    if _KINDS_READY:
        # Imported here: diffsweep.config.kinds imports this module.
        from diffsweep.config.kinds import ensure_registered

        ensure_registered()


class AttentionKind(StrEnum, metaclass=_OpenKindType):
    """What attention computes (the math and the parameters): an *open* enum.

    The paper's three kinds are declared here; a kind defined elsewhere (``diffsweep.config.kinds``
    or a user's package through an entry point) becomes a member when it is registered
    (``_extend``), so decoding, listing, ``is`` comparisons and pickling treat all kinds alike and
    an unknown name still fails with the list of registered ones.
    """

    TRANSFORMER = "transformer"  # LLaMA-style softmax attention (MHA/GQA), the baseline
    DIFF_V1 = "diff_v1"  # Differential Transformer, paper eq. 1-3
    DIFF_V2 = "diff_v2"  # Differential Transformer V2 (blog): 2h query heads, per-token lambda

    # What ``enum`` sets on every member it creates and ``_extend`` sets on the members it adds
    # (typeshed declares neither). Annotations only: no value, so no member and no class attribute.
    __objclass__: type[AttentionKind]
    _sort_order_: int

    @classmethod
    def _extend(cls, value: str) -> AttentionKind:
        """The member named ``value``, added to the enum if it is new (used by kind registration).

        Enums cannot be extended through their public API; this adds the member to the three
        tables every ``EnumType`` lookup and iteration reads (``_member_map_``, ``_member_names_``,
        ``_value2member_map_``), the same way ``enum`` itself creates a member.
        """
        existing = cls._value2member_map_.get(value)
        if isinstance(existing, cls):  # the map holds this enum's members only: None or a kind
            return existing
        member = str.__new__(cls, value)
        member._name_, member._value_ = value.upper(), value
        member.__objclass__ = cls
        member._sort_order_ = len(cls._member_names_)
        cls._member_map_[member._name_] = member
        cls._member_names_.append(member._name_)
        cls._value2member_map_[value] = member
        if not hasattr(cls, member._name_):  # ``AttentionKind.DIFF_V3`` as for a declared member
            type.__setattr__(cls, member._name_, member)
        return member


_KINDS_READY = True


class LambdaInitStrategy(StrEnum):
    """How DIFF V1's lambda_init depends on depth (paper §2.1, Table 6)."""

    EXP_DECAY = "exp_decay"  # 0.8 - 0.6 * exp(-0.3 * (l - 1)), l = 1..L
    CONSTANT = "constant"  # written ``constant:<value>``, value in (0, 1)


class HeadNorm(StrEnum):
    """Per-head normalization of the attention output (the paper's "GroupNorm")."""

    RMSNORM = "rmsnorm"
    NONE = "none"


class Backend(StrEnum):
    """Which kernel computes attention. Independent of ``AttentionKind``."""

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
    WSD = "wsd"  # warmup-stable-decay


class Precision(StrEnum):
    """Numeric precision of training."""

    AUTO = "auto"  # bf16 autocast on GPU, fp32 on CPU
    FP32 = "fp32"
    BF16 = "bf16"  # bf16 autocast, fp32 master weights


class Parallel(StrEnum):
    """How training spreads over several processes (used only when there is more than one)."""

    DDP = "ddp"  # DistributedDataParallel: a full replica per GPU, gradients all-reduced
    FSDP = "fsdp"  # FSDP2 (fully_shard per block): parameters, gradients and optimizer state sharded


class TokenizerKind(StrEnum):
    """Tokenizer of a dataset; part of a run's identity."""

    CL100K_BASE = "cl100k_base"  # the paper's tokenizer (offline copy)
    BPE = "bpe"  # byte-level BPE trained offline on the corpus (small vocab for tiny models)
    BYTES = "bytes"  # raw UTF-8 bytes, vocab 256
