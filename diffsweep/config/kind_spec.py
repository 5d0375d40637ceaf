"""``KindSpec``: everything the code asks about one attention kind, as torch-free data and formulas.

A kind is one ``KindSpec`` (registered in ``builtin_kinds.py`` or through an entry point) plus its
``nn.Module`` (named by ``module``, imported only when a model is built). Validation, counting,
the memory planner, sweeps, summaries, probes and plots ask the spec; none of them branches on a
kind's name.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from diffsweep.config.enums import HeadNorm

if TYPE_CHECKING:  # only for annotations: schema imports validate, which imports the kinds
    from diffsweep.config.schema import ResolvedAttention

Shape = tuple[int, ...]


@dataclass(frozen=True)
class ParamInfo:
    """One parameter: its shape and whether it is a matmul weight (counts toward FLOPs)."""

    shape: Shape
    matmul: bool = False

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n


@dataclass(frozen=True)
class NameToken:
    """How a sweep axis appears in run names: ``<prefix>_<value>`` with some values respelled.

    ``drop_prefix`` is removed from the value first (``constant:0.8`` -> ``lam_0.8``).
    """

    prefix: str
    spellings: Mapping[str, str] = field(default_factory=dict)
    drop_prefix: str = ""

    def render(self, text: str) -> str:
        text = self.spellings.get(text, text)
        return text.removeprefix(self.drop_prefix) if self.drop_prefix else text


class KindSpec:
    """The torch-free definition of one attention kind. Subclass it and fill in the class attributes
    and the three formulas (``attention_params``, ``attention_flops``, ``saved_bytes``).

    Head geometry is in units of the baseline head dim d: a kind has ``num_heads`` output heads,
    each reading ``v_width * d`` value channels, so its default head count is
    ``d_model / (v_width * d)`` and ``wo`` is ``(d_model, num_heads * v_width * d)``.
    """

    name: ClassVar[str]  # the config value, ``model.attention.kind``
    display_name: ClassVar[str]  # in reports and plot legends, e.g. "DIFF V1"
    color: ClassVar[str | None] = None  # plot colour; None: one from matplotlib's cycle
    description: ClassVar[str] = ""
    module: ClassVar[str]  # "package.module:ClassName" of the nn.Module, imported when a model is built

    v_width: ClassVar[int] = 1  # value channels per output head, in units of d
    query_heads_per_head: ClassVar[int] = 1  # query (sub-)heads per output head
    key_heads_per_kv_head: ClassVar[int] = 1  # key (sub-)heads per K/V head or group
    default_head_norm: ClassVar[HeadNorm] = HeadNorm.NONE
    head_norms: ClassVar[tuple[HeadNorm, ...]] = (HeadNorm.NONE,)  # allowed per-head norms
    # AttentionConfig fields only this kind uses (their defaults are the schema's); setting one for
    # another kind warns that it has no effect.
    switches: ClassVar[tuple[str, ...]] = ()
    # Sweep axes that vary this kind's runs; a grid axis in no kind's list but other kinds' lists
    # is dropped for this kind's points (so it does not multiply its runs).
    sweep_axes: ClassVar[frozenset[str]] = frozenset()
    name_tokens: ClassVar[Mapping[str, NameToken]] = {}  # run-name tokens of this kind's axes
    # Calls the backend's ``diff_attend`` (two maps, one λ) rather than ``attend``: decides which
    # kernels a backend must support and which backends the attention benchmark compares.
    differential: ClassVar[bool] = False
    probes: ClassVar[tuple[str, ...]] = ()  # metric families the module's ``probe`` reports, e.g. "lambda"

    # -- formulas (pure Python; a test checks them against the real module tree) ------------------

    def attention_params(self, a: ResolvedAttention, d_model: int) -> dict[str, ParamInfo]:
        """Every parameter of one attention module, by its name inside the module."""
        raise NotImplementedError

    def attention_flops(self, a: ResolvedAttention, seq_len: int) -> int:
        """Forward FLOPs per token of the score and value products (projections are counted from
        ``attention_params``), full T x T (see ``diffsweep.model.counting``)."""
        raise NotImplementedError

    def saved_bytes(self, a: ResolvedAttention, c: int) -> int:
        """Bytes per token one module saves for the backward, without ``wo``'s input (c: 4 fp32, 2 bf16;
        see ``diffsweep.model.memory``)."""
        raise NotImplementedError

    def input_readers(self, a: ResolvedAttention) -> int:
        """Matmuls that read the attention input (under bf16 autocast each saves its own cast copy)."""
        return 3  # wq, wk, wv

    def call_shape(self, a: ResolvedAttention) -> tuple[int, int, int, int]:
        """(query heads, K/V heads, QK dim, V dim) of the one backend call the module makes."""
        q_heads = a.num_heads if self.differential else a.num_heads * self.query_heads_per_head
        return q_heads, a.num_kv_heads, a.head_dim, self.v_width * a.head_dim

    # -- hooks with defaults ----------------------------------------------------------------------

    def check(self, a: ResolvedAttention, key: str) -> None:
        """Warn (``ConfigWarning``) about settings of a resolved ``a`` that do not do what they say."""

    def summary(self, a: ResolvedAttention, n_layers: int) -> dict[str, Any]:
        """Extra fields for ``diffsweep model info``; an ``"attention"`` mapping is merged into its own."""
        return {}

    def load_module(self) -> type:
        """The ``nn.Module`` class (imports torch): built as ``cls(model_config, layer, backend)``."""
        path, _, name = self.module.partition(":")
        return getattr(importlib.import_module(path), name)

    def __repr__(self) -> str:
        return f"<attention kind {self.name!r}>"
