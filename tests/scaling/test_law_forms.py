"""Law forms as registered definitions: the registry, the contract every form meets, a form added
in a test and fitted end to end, and the CLI's closed choices (numpy-free, one-line errors)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from diffsweep.config import ConfigError, EnvironmentUnavailable
from diffsweep.scaling.analysis import FitRequest, analyse
from diffsweep.scaling.fitting.fit import fit_law
from diffsweep.scaling.fitting.forms import Law
from diffsweep.scaling.fitting.optimize import Data
from diffsweep.scaling.laws import BUILTIN, LAW_FORMS, law_form, law_form_names, law_forms, register
from diffsweep.scaling.laws.base import LawForm
from diffsweep.scaling.result import FitResult
from diffsweep.scaling.table import _complete
from tests.helpers.badinput import refused
from tests.helpers.cli import run
from tests.plugins.toy_kind.toy_kind.law import KaplanNc

# -- the registry ----------------------------------------------------------------------------------


def test_the_forms_are_listed_without_importing_them_and_each_is_its_own_name():
    """The CLI's list of forms costs no import (the definitions import numpy); each name gives
    the definition of that name, in the same order."""
    assert law_form_names() == list(BUILTIN) == ["offset", "pure", "chinchilla"]
    assert [f.name for f in law_forms()] == law_form_names()


def test_an_unknown_form_is_an_error_keyed_by_the_field():
    with pytest.raises(ConfigError) as err:
        law_form("kaplan")
    assert err.value.key == "form" and err.value.message == ("unknown law form 'kaplan'; expected one of "
                                                             "[offset, pure, chinchilla]")


def test_a_form_that_does_not_load_is_left_out_of_the_list_with_a_warning_and_named_when_asked_for():
    """A user's broken package (here: a form registered as a module that does not exist) cannot stop a
    fit with a built-in form, whose messages list the forms; asked for by name, it fails with the reason."""
    LAW_FORMS.register("broken", "no_such_package.laws:Broken")
    try:
        with pytest.warns(RuntimeWarning, match="law form 'broken' .* could not be loaded: ModuleNotFoundError.*; "
                          "left out"):
            assert [f.name for f in law_forms()] == ["offset", "pure", "chinchilla"]
        with pytest.raises(EnvironmentUnavailable, match="law form 'broken' .* No module named 'no_such_package'"):
            law_form("broken")
    finally:
        LAW_FORMS.unregister("broken")


def test_fit_with_a_form_that_does_not_load_is_one_line_exit_3_and_writes_nothing(tmp_path):
    """``fit --form broken`` (a user's package that is not installed): one line naming the form and
    why, exit 3 (the machine lacks a package), no traceback and no fit folder."""
    from tests.scaling.synthetic import ladder

    ladder(noise_sd=0.004, seeds=2).to_csv(tmp_path / "p.csv", index=False)
    LAW_FORMS.register("broken", "no_such_package.laws:Broken")
    try:
        r = run("fit", "--csv", str(tmp_path / "p.csv"), "--no-log", "--form", "broken", "--boot", "50",
                "--out", str(tmp_path / "out"))
    finally:
        LAW_FORMS.unregister("broken")
    refused(r, "law form 'broken' ('no_such_package.laws:Broken') could not be loaded: ModuleNotFoundError",
            code=3)
    assert not (tmp_path / "out").exists()


def test_a_form_cannot_be_registered_twice():
    with pytest.raises(ValueError, match="already registered"):
        register(type(law_form("offset"))())


def test_a_shared_e_on_a_form_without_one_is_an_error_keyed_by_the_field():
    with pytest.raises(ConfigError) as err:
        Law("pure", n_groups=2, shared_e=True)
    assert err.value.key == "shared_e" and err.value.message == "a shared E needs --form offset, not pure"


# -- the contract of a definition (run for every registered form) ----------------------------------

def _design(form: LawForm) -> tuple[np.ndarray, np.ndarray | None]:
    u = np.log(np.geomspace(1e8, 1e10, 6))
    return u, (np.log(np.geomspace(1e10, 1e11, 6)) if form.joint_nd else None)


def _theta(law: Law) -> np.ndarray:
    """A plausible point: every coefficient e (θ = 1), every exponent 0.3."""
    return np.array([[1.0 if law.param(n).log else 0.3 for n in law.names]])


@pytest.mark.parametrize("name", list(BUILTIN))
def test_a_forms_jacobian_matches_finite_differences(name):
    law = Law(name)
    u, v = _design(law.definition)
    theta = _theta(law)
    log_loss, jac = law.predict(theta, u, v)
    step = 1e-6
    for j in range(law.num_params):
        moved = theta.copy()
        moved[0, j] += step
        numeric = (law.predict(moved, u, v)[0] - log_loss) / step
        assert numeric[0] == pytest.approx(jac[0, :, j], abs=1e-5), law.names[j]


@pytest.mark.parametrize("name", list(BUILTIN))
def test_a_forms_inversion_undoes_its_loss_curve(name):
    law = Law(name)
    theta = _theta(law)
    x = np.geomspace(1e8, 1e10, 5)
    other = 1e11 if law.definition.joint_nd else None
    for axis in ("N", "D") if law.definition.joint_nd else ("N",):
        loss = law.loss_at(theta, x, other=other, axis=axis)
        assert law.invert(theta, loss, other=other, axis=axis) == pytest.approx(x[None, :], rel=1e-8)


# -- a form registered here at run time: nothing else in the library is touched ----------------------
# Kaplan et al.'s own parameterisation of the pure law, L = (N_c / x)^α, fitted as (c = log N_c, α): not
# linear in θ (log L = α·c - α·u), so it exercises the generic grid and refit machinery. The toy plugin
# package defines it (its entry point is used from the CLI in tests/plugins/test_toy_kind.py); here the
# class is registered at run time instead.

NC, ALPHA, RHO = 8.8e13, 0.076, 0.62  # Kaplan et al. (2020) eq. 1.1: N_c = 8.8e13, α_N = 0.076


@pytest.fixture
def kaplan_nc():
    form = register(KaplanNc())
    yield form
    LAW_FORMS.unregister(form.name)


def _kaplan_table() -> pd.DataFrame:
    sizes = np.geomspace(1e8, 1e10, 5)
    rows = [{"arch": arch, "num_params": n, "tokens": 1e10, "loss": (NC / (n / rho)) ** ALPHA, "seed": seed,
             "run_name": f"{arch}-{n:.3g}-s{seed}"}
            for arch, rho in (("transformer", 1.0), ("diff_v1", RHO)) for n in sizes for seed in range(2)]
    return _complete(pd.DataFrame(rows))


def test_a_form_registered_in_a_test_fits_through_the_library(kaplan_nc):
    u = np.log(np.geomspace(1e8, 1e10, 5))
    fit = fit_law(Law("kaplan_nc"), Data(u=u, y=ALPHA * (np.log(NC) - u)))
    p = {k: float(v[0]) for k, v in fit.law.natural(fit.theta[None, :]).items()}
    assert p["Nc"] == pytest.approx(NC, rel=1e-6) and p["alpha"] == pytest.approx(ALPHA, rel=1e-6)


def test_a_form_registered_in_a_test_is_analysed_and_reported_end_to_end(kaplan_nc, tmp_path):
    """analyse -> FitResult -> report, with the new form known only to the registry."""
    from diffsweep.scaling.report import markdown

    result = analyse(_kaplan_table(), FitRequest(form="kaplan_nc", n_boot=50))
    assert isinstance(result, FitResult) and result.form == "kaplan_nc" and result.axis == "N"
    assert [row["ratio"] for row in result.ratios] == pytest.approx([RHO, RHO], rel=1e-6)
    assert result.fits["transformer"]["params"]["Nc"] == pytest.approx(NC, rel=1e-6)
    assert set(result.curves) == {"transformer", "diff_v1"} and result.curves["diff_v1"].draws.shape == (50, 2)
    assert result.pure_law_fits is None and result.shift_model is None and result.compute_optimal is None
    document = result.to_dict()
    assert "pure_law_fits" not in document and "curves" not in document and "points" not in document
    json.dumps(document)  # JSON-able as it is
    report = markdown(document, "toy")
    assert "L = (N_c/N)^α, a pure power law in Kaplan et al.'s parameterisation" in report


def test_the_documents_keys_are_the_fields_in_order_without_the_ones_not_made():
    from tests.scaling.synthetic import ladder

    result = analyse(ladder(noise_sd=0.004, seeds=2, rng=np.random.default_rng(5)), FitRequest(n_boot=50))
    assert list(result.to_dict()) == [
        "axis", "count", "form", "objective", "shared_e", "baseline", "candidates", "level", "n_boot", "seed",
        "noise", "resampling", "measured_range", "other_ref", "fits", "ratios", "ratio_curve", "per_point",
        "paper_reading", "points_used", "pure_law_fits", "shift_model", "warnings"]
    assert result.points is not None and result.points["used"].all()


# -- the CLI: closed choices as enums, no heavy imports for help -------------------------------------

@pytest.mark.parametrize("args", [["--help"], ["fit", "--help"]])
def test_help_imports_no_numpy_scipy_torch_or_mlflow(args):
    """In a fresh process: what ``--help`` imports is the point, and this test process has them all."""
    code = ("import runpy, sys\nsys.argv = ['diffsweep', *sys.argv[1:]]\n"
            "try:\n    runpy.run_module('diffsweep', run_name='__main__')\nexcept SystemExit:\n    pass\n"
            "print([m for m in ('numpy', 'scipy', 'torch', 'mlflow', 'pandas') if m in sys.modules], file=sys.stderr)")
    r = subprocess.run([sys.executable, "-c", code, *args], check=False, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "COLUMNS": "200"})
    assert r.stderr.strip().splitlines()[-1] == "[]", r.stderr


def test_fit_help_lists_every_closed_choice():
    r = run("fit", "--help", env={"COLUMNS": "200"})
    for choices in ("[auto|N|D]", "[offset|pure|chinchilla]", "[l2|huber|huber_mle]", "[total|non_embedding]",
                    "[largest]", "[auto|final|checkpoints]"):
        assert choices in r.stdout, choices


@pytest.mark.parametrize(("flag", "value", "allowed"), [
    ("--form", "kaplan", "[offset, pure, chinchilla]"), ("--objective", "l3", "[l2, huber, huber_mle]"),
    ("--axis", "X", "[auto, N, D]"), ("--count", "all", "[total, non_embedding]"),
    ("--token-points", "some", "[auto, final, checkpoints]"), ("--holdout", "smallest", "[largest]")])
def test_a_wrong_choice_is_one_line_exit_2(tmp_path, flag, value, allowed):
    r = run("fit", "--csv", str(tmp_path / "none.csv"), "--no-log", flag, value)
    refused(r, f"error: {flag}: expected one of {allowed}, got '{value}'")


def test_a_library_error_keyed_by_field_reaches_the_user_as_its_flag(tmp_path):
    from tests.scaling.synthetic import ladder

    ladder(noise_sd=0.004, seeds=2).to_csv(tmp_path / "p.csv", index=False)
    r = run("fit", "--csv", str(tmp_path / "p.csv"), "--no-log", "--shared-e", "--form", "pure",
            "--out", str(tmp_path / "out"))
    refused(r, "error: --shared-e: a shared E needs --form offset, not pure")
    r = run("fit", "--csv", str(tmp_path / "p.csv"), "--no-log", "--form", "chinchilla",
            "--holdout", "largest", "--boot", "50", "--out", str(tmp_path / "out"))
    refused(r, "error: --holdout: is for the one-variable laws (--form offset or pure)")
