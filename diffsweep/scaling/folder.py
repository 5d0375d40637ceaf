"""A fit's output folder (``fits/<name>/``): what ``diffsweep fit`` writes there, when it may replace
a folder that is already there, and how ``suggest`` reads one back.

``fit`` writes fit.json, points.csv, report.md and plots/*.png and nothing else. It replaces only
a folder that holds nothing but those (an earlier fit's outputs, its fit.json a fit document), or
an empty one; it never writes into a folder that holds anything else, nor one that holds its input.
A fit folder read back is the user's to edit or damage: fit.json's fields are decoded strictly
(``SavedFit``, with the bounds ``FitRequest`` checks), each error one line naming the file and field.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from diffsweep.config import ConfigError
from diffsweep.config.decode import Check, confidence_level, decode, read_json_fields, strict_string
from diffsweep.scaling.choices import Axis, Count, Objective
from diffsweep.scaling.request import check_sd

if TYPE_CHECKING:
    import pandas as pd

    from diffsweep.scaling.request import FitRequest

FILES = ("fit.json", "points.csv", "report.md")
PLOTS = "plots"
PLOT_FILES = ("loss.png", "residuals.png", "ratio.png", "sensitivity.png")
_AXES = {"N": Axis.N, "D": Axis.D, "N,D": Axis.AUTO}  # fit.json's axis -> the request's (a joint law: auto)


# -- writing -----------------------------------------------------------------------------------------


def check_out(folder: Path, inputs: tuple[Path, ...] = ()) -> None:
    """Refuse ``folder`` as a fit's output unless it is new, empty, or an earlier fit's outputs, and
    unless it neither is nor holds one of ``inputs``. Raises ``ConfigError('out', ...)``."""
    target = folder.absolute().resolve()
    for path in inputs:
        source = path.absolute().resolve()
        if source == target:
            raise ConfigError("out", f"{folder} is the input; write the fit to a folder of its own")
        if target in source.parents:
            raise ConfigError("out", f"{folder} holds the input {path}; write the fit to another folder")
    if not folder.exists() and not folder.is_symlink():
        return
    if folder.is_symlink():
        raise ConfigError("out", f"{folder} is a symbolic link; give the folder it points to, or a new one")
    if not folder.is_dir():
        raise ConfigError("out", f"{folder} exists and is not a directory")
    foreign = _foreign(folder)
    if foreign is not None:
        raise ConfigError("out", f"{folder} holds {foreign}, which diffsweep fit did not write; give a new or empty "
                          "folder, or an earlier fit's folder to replace")


def _foreign(folder: Path) -> str | None:
    """The first entry of ``folder`` a fit does not write (None: an empty folder or a fit's outputs)."""
    entries = sorted(folder.iterdir())
    if not entries:
        return None
    for entry in entries:
        if entry.is_symlink() or (entry.name in FILES and not entry.is_file()):
            return entry.name
        if entry.name == PLOTS and entry.is_dir():
            extra = [p for p in sorted(entry.iterdir()) if p.name not in PLOT_FILES or p.is_symlink() or not p.is_file()]
            if extra:
                return f"{PLOTS}/{extra[0].name}"
        elif entry.name not in FILES:
            return entry.name
    try:
        read_json_fields(_FitDocument, folder / "fit.json", "fit document")
    except (OSError, ConfigError):
        return "fit.json" if (folder / "fit.json").exists() else entries[0].name  # not a fit's document
    return None


@dataclass(frozen=True)
class _FitDocument:
    """What tells a fit's own ``fit.json`` (the rest of it is the report's)."""

    axis: Any
    fits: Any
    source: Any


# -- reading back -----------------------------------------------------------------------------------


def _name(value: Any, key: str) -> str:
    text = strict_string(value, key)
    if not text.strip():
        raise ConfigError(key, "expected an architecture name, got ''")
    return text


def _axis(value: Any, key: str) -> str:
    if value not in _AXES:
        raise ConfigError(key, f"expected one of [{', '.join(_AXES)}], got {value!r}")
    return value


def _form(value: Any, key: str) -> str:
    from diffsweep.scaling.laws import law_form_names

    names = law_form_names()
    if not isinstance(value, str) or value not in names:
        raise ConfigError(key, f"expected one of [{', '.join(names)}], got {value!r}")
    return value


def _sd(value: Any, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
        raise ConfigError(key, f"expected a non-negative finite sd of log loss, got {value!r}")
    return float(value)


def _column(value: Any, key: str) -> str:
    text = strict_string(value, key)
    if not text.strip():
        raise ConfigError(key, "expected a column name of the points, got ''")
    return text


def _noise_source(value: Any, key: str) -> str:
    allowed = ("given", "seeds", "residuals")  # bootstrap.Noise.source
    if value not in allowed:
        raise ConfigError(key, f"expected one of [{', '.join(allowed)}], got {value!r}")
    return value


@dataclass(frozen=True)
class SavedNoise:
    """fit.json's ``noise``: where the noise came from, and its sd (a given one is reused)."""

    source: Annotated[str, Check(_noise_source)]
    sd: Annotated[float, Check(_sd)]


@dataclass(frozen=True)
class SavedTuning:
    """fit.json's ``tuning``: the tuning columns of a best-of-grid fit (``fit --tune``)."""

    columns: list[Annotated[str, Check(_column)]]


@dataclass(frozen=True)
class SavedFit:
    """The fields of fit.json that make its request (what ``suggest`` refits with)."""

    baseline: Annotated[str, Check(_name)]
    candidates: list[Annotated[str, Check(_name)]]
    axis: Annotated[str, Check(_axis)]
    form: Annotated[str, Check(_form)]
    objective: Objective
    count: Count
    shared_e: bool
    level: Annotated[float, Check(confidence_level)]
    noise: SavedNoise
    tuning: SavedTuning | None = None  # None: an untuned fit

    def request(self, n_boot: int, seed: int) -> FitRequest:
        """The fit request the fit was made with, with ``n_boot`` draws and ``seed``."""
        from diffsweep.scaling.request import FitRequest

        return FitRequest(baseline=self.baseline, candidates=tuple(self.candidates), axis=_AXES[self.axis],
                          form=self.form, objective=self.objective, count=self.count, shared_e=self.shared_e,
                          n_boot=n_boot, level=self.level, seed=seed,
                          noise_sd=self.noise.sd if self.noise.source == "given" else None,
                          tune=tuple(self.tuning.columns) if self.tuning else ())


def read_fit(folder: Path) -> tuple[pd.DataFrame, SavedFit]:
    """A fit folder's points (points.csv, checked as any CSV) and fit.json's request fields."""
    from diffsweep.scaling.table import from_csv

    fit_json, points_csv = folder / "fit.json", folder / "points.csv"
    for path in (fit_json, points_csv):
        if not path.is_file():
            raise ConfigError(str(folder), f"is not a fit folder: no {path.name} in it (a folder diffsweep fit wrote "
                              "holds fit.json and points.csv)")
    try:
        text = fit_json.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(str(fit_json), f"cannot read it ({getattr(exc, 'strerror', None) or exc})") from None
    if not text.strip():
        raise ConfigError(str(fit_json), "is empty; refit with diffsweep fit")
    try:
        document = json.loads(text)
    except ValueError as exc:
        raise ConfigError(str(fit_json), f"not valid JSON ({str(exc).splitlines()[0]}); refit with diffsweep fit") \
            from None
    if not isinstance(document, dict):
        raise ConfigError(str(fit_json), f"expected a JSON object (a fit's document), got {type(document).__name__}")
    # only the fields read here: the rest of the document is the report's
    raw = {f.name: document[f.name] for f in fields(SavedFit) if f.name in document}
    for key, kind in (("noise", SavedNoise), ("tuning", SavedTuning)):
        if isinstance(raw.get(key), dict):
            raw[key] = {f.name: raw[key][f.name] for f in fields(kind) if f.name in raw[key]}
    saved = decode(SavedFit, raw, source=str(fit_json))
    if saved.noise.source == "given":  # reused as --noise-sd: the same bound
        check_sd(saved.noise.sd, f"{fit_json}: noise.sd")
    points = from_csv(points_csv)
    present = set(points["arch"])
    for i, name in [(None, saved.baseline), *enumerate(saved.candidates)]:
        if name not in present:
            key = "baseline" if i is None else f"candidates[{i}]"
            raise ConfigError(f"{fit_json}: {key}", f"'{name}' has no points in {points_csv} (architectures there: "
                              f"{', '.join(sorted(present))})")
    return points, saved
