"""The registry of scaling-law forms: one definition per ``--form``, registered once.

``law_form(name)`` is the only way code reaches a form's behaviour. The built-in forms are listed
in ``BUILTIN`` as ``"module:Class"`` strings, so the names cost no import (``diffsweep fit --help``
loads no numpy); a new form is one file (a ``LawForm`` subclass in ``laws/<name>.py``, see
docs/extending.md) and its line here. A user's package adds one through the entry-point group
``diffsweep.law_forms``; ``register`` adds one at run time (a test). One ``diffsweep.config.registry.Registry``,
as for schedulers and probes.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

from diffsweep.config import EnvironmentUnavailable
from diffsweep.config.registry import Registry

if TYPE_CHECKING:
    from diffsweep.scaling.laws.base import LawForm

ENTRY_POINT_GROUP = "diffsweep.law_forms"
# In the order the CLI and the errors list them.
BUILTIN = {
    "offset": "diffsweep.scaling.laws.offset:OffsetLaw",  # L = E + A x^-α (the default; Chinchilla-style offset)
    "pure": "diffsweep.scaling.laws.pure:PureLaw",  # L = A x^-α (Kaplan et al. 2020: no irreducible term)
    "chinchilla": "diffsweep.scaling.laws.chinchilla:ChinchillaLaw",  # L = E + A/N^α + B/D^β (Hoffmann et al. 2022)
}
DEFAULT = "offset"

LAW_FORMS: Registry[LawForm] = Registry("law form", ENTRY_POINT_GROUP, "diffsweep.scaling.laws.base:LawForm",
                                        BUILTIN, key="form")


def register(form: LawForm) -> LawForm:
    """Add ``form`` under its ``name``; a second form with the same name is an error."""
    LAW_FORMS.register(form.name, form)
    return form


def law_form(name: str, key: str = "form") -> LawForm:
    """The registered definition of the form ``name``; an unknown name is a ``ConfigError`` on ``key``."""
    return LAW_FORMS.get(str(name), key)


def law_form_names() -> list[str]:
    """Every form's name (built-in, registered, then the entry points'), importing none of them."""
    return LAW_FORMS.names()


def law_forms() -> tuple[LawForm, ...]:
    """Every form that loads, in that order. One that does not (a user's broken package) is left out
    with a warning, so that it cannot stop a fit with a built-in form (as for attention kinds)."""
    forms = []
    for name in law_form_names():
        try:
            forms.append(law_form(name))
        except EnvironmentUnavailable as exc:  # a registered or a package's form (a built-in one raises)
            warnings.warn(f"{exc}; left out", RuntimeWarning, stacklevel=2)
    return tuple(forms)


__all__ = ["BUILTIN", "DEFAULT", "LAW_FORMS", "law_form", "law_form_names", "law_forms", "register"]
