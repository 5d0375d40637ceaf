"""What a probe is, and the registry of probes by name.

A probe measures a trained model offline, on synthetic prompts or on the validation split the run
trained on. Each is one module in ``diffsweep/eval/probes/`` (or a user's package) defining one
``Probe`` subclass, registered here by name (``PROBES``) or through the entry-point group
``diffsweep.probes`` (``name = "package.module:Class"``): one ``diffsweep.config.registry.Registry``.

A probe has typed settings: a frozen dataclass (``Probe.Settings``) decoded strictly with the
one decoder from ``NAME.KEY=VALUE`` items (``diffsweep eval --probe-set needle.samples=10``) or a
sweep file's ``eval:`` section, so a bad setting is one line naming ``NAME.KEY``.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from diffsweep.config import ConfigError
from diffsweep.config.decode import decode
from diffsweep.config.registry import Registry

if TYPE_CHECKING:
    import numpy as np
    import torch

    from diffsweep.config import Config
    from diffsweep.data.tokenizers import Tokenizer
    from diffsweep.model.transformer import LanguageModel

ENTRY_POINT_GROUP = "diffsweep.probes"


@dataclass(frozen=True)
class NoSettings:
    """The settings of a probe that has none."""


@dataclass
class EvalContext:
    """What a probe runs on: one trained checkpoint of one run.

    ``model`` is in eval mode on ``device``, its attention backend the one the run trained with
    (``model.cfg.attention.backend``); ``val_tokens`` is the run's validation split (token ids);
    ``out_dir`` is an empty directory for the probe's files (tables, plots), logged as artifacts."""

    model: LanguageModel
    config: Config
    tokenizer: Tokenizer
    val_tokens: np.ndarray
    device: torch.device
    autocast_dtype: torch.dtype | None
    out_dir: Path
    seed: int = 0

    def autocast(self) -> Any:
        """The autocast context of training (bf16 on GPUs), or a null context."""
        import contextlib

        import torch

        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)


@dataclass
class ProbeResult:
    """What a probe found.

    ``metrics``: flat names (``outliers/attn_logit/top1``) to numbers, logged as MLflow metrics
    (a curve over an index, e.g. NLL by position, goes in ``series``: name -> {step: value},
    logged as one metric over steps). ``tables``: name -> rows (dicts of plain values), written as
    ``<name>.json`` and read by ``diffsweep compare``. ``files``: plots and other files the probe
    wrote into ``EvalContext.out_dir``. ``notes``: lines for the user (e.g. a kernel fallback).
    ``capped``: settings the data could not give in full (setting -> ``Capped``), said in the
    summary line and logged as parameters."""

    metrics: dict[str, float] = field(default_factory=dict)
    series: dict[str, dict[int, float]] = field(default_factory=dict)
    tables: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    files: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    capped: dict[str, Capped] = field(default_factory=dict)


@dataclass(frozen=True)
class Capped:
    """A setting the data capped: ``asked`` for, ``used`` instead, and ``why`` (e.g. "the validation
    split has 140,801 tokens")."""

    asked: Any
    used: Any
    why: str

    def __str__(self) -> str:
        def show(v: Any) -> str:
            return f"{v:,}" if isinstance(v, int) else str(v)

        return f"{show(self.asked)} asked, {show(self.used)} used ({self.why})"


@dataclass(frozen=True)
class TableComparison:
    """How ``diffsweep compare SWEEP --probes`` sets one of a probe's tables side by side across
    a sweep's arms: ``table`` (the ``<table>.json`` artifact) rows kept where every ``where``
    column has its value; a cell of the comparison is one value of the ``keys`` columns; each of
    the ``values`` columns (numbers) is compared across arms cell by cell. ``mean_over``: also a
    cell averaging each run's values over this key column (its value "mean"), e.g. needle accuracy
    over depths. ``x``: plot the values as curves against this key column (``log_x``: on a log
    scale); otherwise as bars by cell. ``title`` names the paper's table or figure."""

    table: str
    title: str
    keys: tuple[str, ...]
    values: tuple[str, ...]
    where: tuple[tuple[str, Any], ...] = ()
    mean_over: str | None = None
    x: str | None = None
    log_x: bool = False


class Probe(ABC):
    """Base class of probes. Subclasses set ``name``, ``summary``, ``cites``, ``headline`` and
    ``Settings``, and define ``run``; ``check`` refuses settings that cannot work with a run's config
    before anything runs (e.g. a context longer than the model's) and is the one place each setting's
    value is validated (its type is the decoder's)."""

    name: ClassVar[str]
    summary: ClassVar[str]  # one line for ``diffsweep eval --help`` and the docs
    cites: ClassVar[str]  # the paper's table/figure/section it reproduces
    # The metric that sums up a result in ``diffsweep eval``'s one line per evaluation; ``str.format``
    # fields are the settings' (e.g. ``needle/N{needles}_R{queries}/accuracy``); see ``headline_metric``.
    headline: ClassVar[str] = ""
    Settings: ClassVar[type] = NoSettings
    # How the docs' table says a setting's default where its value alone does not (0: "the run's")
    defaults_shown: ClassVar[Mapping[str, str]] = {}
    comparisons: ClassVar[tuple[TableComparison, ...]] = ()  # its tables in ``diffsweep compare --probes``

    def check(self, settings: Any, config: Config) -> None:  # noqa: B027 (optional: a probe that any run can take)
        """Raise ``ConfigError`` (key ``<probe>.<setting>``) if ``settings`` cannot run on ``config``."""

    def headline_metric(self, settings: Any) -> str:
        """The name of the metric that sums up a result with ``settings`` (``headline`` filled in)."""
        return self.headline.format(**settings_dict(settings)) if self.headline else ""

    @abstractmethod
    def run(self, ctx: EvalContext, settings: Any) -> ProbeResult:
        """Measure ``ctx``'s model with ``settings`` (already checked)."""


# Built-in probes: name -> "module:Class" (imported on first use: probes import torch).
PROBES: dict[str, str] = {
    "outliers": "diffsweep.eval.probes.outliers:OutliersProbe",
    "quantization": "diffsweep.eval.probes.quantization:QuantizationProbe",
    "needle": "diffsweep.eval.probes.needle:NeedleProbe",
    "attention_focus": "diffsweep.eval.probes.attention_focus:AttentionFocusProbe",
    "nll_position": "diffsweep.eval.probes.nll_position:NllPositionProbe",
    "downstream": "diffsweep.eval.probes.downstream:DownstreamProbe",
    "icl": "diffsweep.eval.probes.icl:IclProbe",
}


PROBES_REGISTRY: Registry[Probe] = Registry("probe", ENTRY_POINT_GROUP, Probe, PROBES)


def probe_names() -> list[str]:
    """Every probe's name: the built-in ones, then those registered through entry points."""
    return PROBES_REGISTRY.names()


def get_probe(name: str, key: str = "probe") -> Probe:
    """The probe called ``name``; an unknown name is a ``ConfigError`` on ``key`` listing them."""
    return PROBES_REGISTRY.get(name, key)


def parse_settings(probe: Probe, items: dict[str, Any], where: str = "") -> Any:
    """``probe``'s settings from ``{key: value}`` (unset keys keep their defaults); errors name
    ``<where><probe>.<key>``."""
    return decode(probe.Settings, items, f"{where}{probe.name}", noun=f"setting of probe {probe.name}")


def settings_dict(settings: Any) -> dict[str, Any]:
    """Settings as plain values (for tags, the idempotency key and JSON)."""
    from diffsweep.config.loading import to_dict

    return to_dict(settings) if dataclasses.is_dataclass(settings) else {}


def probe_requests(names: list[str], items: list[str] | tuple[str, ...] = ()) -> list[tuple[Probe, Any]]:
    """The probes ``names`` (in order, each once) with their settings from ``PROBE.KEY=VALUE``
    ``items`` (values as in ``--set``: numbers, booleans, ``[a, b]`` lists). Errors name the field
    ``probes`` (an unknown probe) or ``probe_settings`` (a malformed item, one for a probe not asked
    for) or ``PROBE.KEY`` (a bad setting)."""
    from diffsweep.config.loading import parse_scalar

    if not names:
        raise ConfigError("probes", f"expected at least one probe, one of [{', '.join(probe_names())}]")
    probes = {name: get_probe(name, key="probes") for name in dict.fromkeys(names)}
    given: dict[str, dict[str, Any]] = {name: {} for name in probes}
    for item in items:
        key, sep, text = item.partition("=")
        name, dot, setting = key.strip().partition(".")
        if not sep or not dot or not name or not setting:
            raise ConfigError("probe_settings", f"expected PROBE.KEY=VALUE (e.g. needle.samples=10), got {item!r}")
        if name not in given:
            raise ConfigError("probe_settings", f"{item!r} sets probe {name!r}, which is not asked for (asked: "
                              f"{', '.join(probes)})")
        given[name][setting] = parse_scalar(text)
    return [(probe, parse_settings(probe, given[name])) for name, probe in probes.items()]


def sweep_requests(names: list[str] | tuple[str, ...], settings: dict[str, dict[str, Any]], where: str
                   ) -> list[tuple[Probe, Any]]:
    """The probes of a sweep file's ``eval:`` section (``where``: the file) with their ``settings``
    (probe -> {key: value}); errors name ``<where>: eval.probes`` or ``eval.settings.<probe>.<key>``."""
    probes = {name: get_probe(name, key=f"{where}: eval.probes") for name in dict.fromkeys(names)}
    for name, values in settings.items():
        if name not in probes:
            raise ConfigError(f"{where}: eval.settings.{name}", f"sets probe {name!r}, which eval.probes does not "
                              f"list ({', '.join(probes) or 'none'})")
        if not isinstance(values, dict):
            raise ConfigError(f"{where}: eval.settings.{name}", f"expected a mapping of settings, got {values!r}")
    return [(probe, parse_settings(probe, settings.get(name, {}), f"{where}: eval.settings."))
            for name, probe in probes.items()]


def save_figure(fig: Any, path: Path) -> Path:
    """Lay out ``fig``, write it to ``path`` (a PNG; its folder created) and close it: how every
    probe's plot is saved."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
