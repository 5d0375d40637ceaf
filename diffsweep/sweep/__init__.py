"""Sweeps: the sweep file (``spec``), derived values (``derive``) and pure expansion into runs
(``expand``). Imports no torch, mlflow or submitit."""

from diffsweep.sweep.expand import Expansion, PlannedRun, expand
from diffsweep.sweep.spec import LaunchSettings, SweepSpec, load_sweep

__all__ = ["Expansion", "LaunchSettings", "PlannedRun", "SweepSpec", "expand", "load_sweep"]
