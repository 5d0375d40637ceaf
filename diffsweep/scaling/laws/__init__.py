"""The registry of scaling-law forms: one definition per ``--form``, registered once.

``law_form(name)`` is the only way code reaches a form's behaviour. The built-in forms are
registered at the bottom of this module, one line each; a new form is one file (a ``LawForm``
subclass, see docs/extending.md), its line here and its ``Form`` member in
``diffsweep.scaling.choices`` (the CLI's numpy-free list of choices). ``register`` also takes a
form defined elsewhere at run time (a test, a user's package): it is then fitted by name through
the library, ``FitRequest(form="my_form")``, though not offered by the CLI's ``--form``.
"""

from __future__ import annotations

from diffsweep.config import ConfigError
from diffsweep.scaling.laws.base import LawForm, Param
from diffsweep.scaling.laws.chinchilla import ChinchillaLaw
from diffsweep.scaling.laws.offset import OffsetLaw
from diffsweep.scaling.laws.pure import PureLaw

REGISTRY: dict[str, LawForm] = {}


def register(form: LawForm) -> LawForm:
    """Add ``form`` under its ``name``; a second form with the same name is an error."""
    if form.name in REGISTRY:
        raise ValueError(f"a law form named {form.name!r} is already registered ({type(REGISTRY[form.name]).__name__})")
    REGISTRY[form.name] = form
    return form


def law_form(name: str) -> LawForm:
    """The registered definition of the form ``name`` (a ``Form`` member or a registered name)."""
    try:
        return REGISTRY[str(name)]
    except KeyError:
        raise ConfigError("form", f"expected one of [{', '.join(REGISTRY)}], got '{name}'") from None


def law_forms() -> tuple[LawForm, ...]:
    """Every registered form, in registration order."""
    return tuple(REGISTRY.values())


# -- the built-in forms, in the order the CLI lists them (each also a member of choices.Form) --
register(OffsetLaw())
register(PureLaw())
register(ChinchillaLaw())

__all__ = ["REGISTRY", "LawForm", "Param", "law_form", "law_forms", "register"]
